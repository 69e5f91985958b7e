"""The torch plugin's GPU path on a machine without a GPU: a real LibTorch
program whose GPU ops are computed by the CPU over CUDA tensors of host
memory (tests/cpp/host_gpu_ops.cc), under the real preload and plugin,
with a stand-in libnanhunt_cuda.so (tests/cpp/host_gpu_library.cc) that
checks on the CPU and delivers the results late from its own thread, as
the real one does from the GPU. What runs for real here is everything of
the GPU path but the kernels: the outputs described and enqueued, late
results judged in order (origins, inputs non-finite before), checks held
back for batches, two devices and a side stream, capture and released
memory named in the trace.
scripts/gpu-check.sh checks the same on a GPU, with the real library and
its kernels (the demo, side streams, capture, batches)."""
import sqlite3

import pytest

from conftest import BUILD, LIBNANHUNT, clean_env, findings, run, view_json

PROGRAM = BUILD / "tests" / "host_gpu_ops"
# The preload library where its plugin finds the stand-in as the
# libnanhunt_cuda.so next to itself (made by the build, tests/CMakeLists.txt).
STAND_IN_PRELOAD = BUILD / "host-gpu" / "lib" / "libnanhunt.so"
GPU_OPS_A_STEP = 3  # mm, add, mul
# host_gpu_ops overflow uploads its fp16 operand where nanhunt does not
# look, each step, as two storages (the tensor and its transpose): memory
# no op nanhunt saw wrote, checked where the mm and the add first read it.
FIRST_READS_A_STEP = 2


def run_gpu_ops(args, out, library, **settings):
    env = clean_env(LD_PRELOAD=library, NANHUNT_OUT=out, **settings)
    return run([PROGRAM, *args], env=env)


def run_logged(args, out, tmp_path, **settings):
    """Runs the program under the stand-in, which logs each enqueue,
    order_after and drain call; returns those lines but the drain at exit,
    once the run has succeeded."""
    log = tmp_path / "calls.log"
    r = run_gpu_ops(args, out, STAND_IN_PRELOAD, HOST_GPU_LOG=str(log), **settings)
    assert r.returncode == 0, r.stderr
    lines = log.read_text().splitlines()
    assert lines[-1] == "drain", lines  # at exit, after what is returned
    return lines[:-1]


def run_held_back(args, out, batch="1"):
    """Runs the program under the stand-in with every result held back
    (HOST_GPU_LAG), as a GPU far behind the host: only the deliveries the
    plugin asks for judge anything before exit. Returns the run and its
    view --json once it has succeeded."""
    r = run_gpu_ops(args, out, STAND_IN_PRELOAD, HOST_GPU_LAG="100000",
                    NANHUNT_GPU_BATCH=batch)
    assert r.returncode == 0, r.stderr
    return r, view_json(out)


def meta(out):
    (trace,) = sorted(out.glob("*.sqlite"))
    return dict(sqlite3.connect(trace).execute("SELECT key, value FROM meta"))


def test_first_origin_is_named_from_results_that_arrive_late(out):
    r = run_gpu_ops(["overflow", "3", "6"], out, STAND_IN_PRELOAD)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    first = report["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::mm", "forward", 3), first
    assert first["dtype"] == "float16"
    # Every GPU output went through the GPU path, and none was left out.
    m = meta(out)
    assert int(m["inputs_checked_at_first_read"]) == 6 * FIRST_READS_A_STEP
    assert int(m["device_checks"]) == 6 * (GPU_OPS_A_STEP + FIRST_READS_A_STEP)
    assert report["unchecked_ops"] == []
    # The add and mul after it only passed the inf on.
    later = [f for f in findings(out) if f["step"] == 3 and f["op"] != "aten::mm"]
    assert {f["op"] for f in later} == {"aten::add", "aten::mul"}
    assert all(f["kind"] == "propagated" for f in later), later
    # GPU inputs are not read again: described by what their writer's
    # check found, never as max|x|=0.
    assert "on the GPU, taken as finite" in first["inputs"], first["inputs"]
    add = next(f for f in later if f["op"] == "aten::add")
    assert "on the GPU, non-finite when the op that wrote it was checked" in add["inputs"], add


def test_a_strided_output_is_read_value_by_value(out):
    # The mul's result is every other column of a buffer of NaN: the GPU
    # path must check the 256 values, inf each, and not the NaN between.
    r = run_gpu_ops(["overflow", "3", "4"], out, STAND_IN_PRELOAD)
    assert r.returncode == 0, r.stderr
    (trace,) = sorted(out.glob("*.sqlite"))
    rows = sqlite3.connect(trace).execute(
        "SELECT elements, nan, posinf FROM op_stats WHERE op = 'aten::mul' AND step = 3").fetchall()
    assert rows == [(256, 0, 256)]


@pytest.mark.parametrize("batch", [None, "32"], ids=["single", "batched"])
def test_a_complex32_fft_that_overflows_is_the_origin_read_as_real_and_imaginary_parts(
        out, batch):
    # An fp16 FFT (FNO models run them on GPUs): its complex32 spectrum is
    # checked on the device as torch.view_as_real lays it out, so the
    # overflow at the zero frequency is the FFT's, and the inverse FFT only
    # passes it on. Before, complex outputs were neither checked nor
    # counted, and the inverse FFT was blamed.
    settings = {"NANHUNT_GPU_BATCH": batch} if batch else {}
    r = run_gpu_ops(["spectral"], out, STAND_IN_PRELOAD, **settings)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    origin = report["first_origin"]
    assert (origin["kind"], origin["op"], origin["dtype"]) == (
        "origin", "aten::_fft_r2c", "float16"), origin
    assert origin["outputs"] == (
        "float16[4, 33] (complex32: 264 real and imaginary parts) max|x|=inf +inf=4"), origin
    later = {f["op"]: f for f in findings(out, "propagated")}
    # The strided copy: its 264 parts, not the NaN of the columns between
    # (inf times 0.5 is inf + NaN i: the 4 NaN are its own).
    assert later["aten::mul"]["outputs"].endswith("max|x|=inf nan=4 +inf=4"), later
    assert "ComplexHalf[4, 33] (complex32: 264 real and imaginary parts)" in (
        later["aten::_fft_c2r"]["inputs"]), later
    assert report["unchecked_ops"] == [], report["unchecked_ops"]


@pytest.mark.parametrize("batch", [None, "32"])
def test_batch_norms_running_variance_is_checked_on_the_gpu_as_written(batch, out):
    # Not in native_batch_norm's schema: its returned values were finite,
    # and the overflow went unseen.
    settings = {"NANHUNT_GPU_BATCH": batch} if batch else {}
    r = run_gpu_ops(["batch-norm"], out, STAND_IN_PRELOAD, **settings)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    origin = report["first_origin"]
    assert (origin["kind"], origin["op"]) == ("origin", "aten::native_batch_norm"), origin
    assert origin["outputs"].endswith(
        "float16[3] (running_var, updated in place) max|x|=inf +inf=3"), origin
    assert "float16[3] (running_mean, updated in place) max|x|=3150;" in origin["outputs"]
    assert report["diagnosis"]["kind"] == "fp16_running_statistics", report["diagnosis"]


def test_checks_held_back_are_enqueued_at_each_optimizer_steps_end(out):
    # With Python's optimizer records, a step's held checks go at its end,
    # not with the next step's ops: one batch a step, the origin as before.
    r = run_gpu_ops(["overflow", "3", "6", "named-steps"], out, STAND_IN_PRELOAD,
                    NANHUNT_GPU_BATCH="32")
    assert r.returncode == 0, r.stderr
    first = view_json(out)["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::mm", "forward", 3), first
    m = meta(out)
    assert int(m["device_checks"]) == 6 * (GPU_OPS_A_STEP + FIRST_READS_A_STEP)
    assert int(m["device_check_batches"]) == 6


def test_ops_on_two_gpus_and_a_side_stream_are_checked_where_they_ran(out, tmp_path):
    # cuda:0's mm on its default stream, an add on a side stream of cuda:0,
    # cuda:1's mul (the overflow): each check on its op's device and
    # stream, the origin cuda:1's mul. Each GPU's operand, made where
    # nanhunt does not look, is checked with its first reader's outputs
    # (cuda:1's apart from the mul's strided output).
    calls = run_logged(["devices"], out, tmp_path)
    assert view_json(out)["first_origin"]["op"] == "aten::mul"
    assert calls == ["enqueue 0 0 2", "enqueue 0 5 1", "enqueue 1 0 1", "enqueue 1 0 1"]


def test_held_checks_go_on_their_own_stream_and_the_next_stream_waits(out, tmp_path):
    # With batches, a stream change on cuda:0 enqueues what was held on the
    # stream it was held for, and makes the new stream wait for it (the
    # program may have ordered the two with an event nanhunt does not see);
    # cuda:1's check goes in a batch of its own.
    calls = run_logged(["devices"], out, tmp_path, NANHUNT_GPU_BATCH="32")
    assert view_json(out)["first_origin"]["op"] == "aten::mul"
    assert calls == [
        "enqueue 0 0 2", "order_after 0 0 5", "enqueue 0 5 1", "order_after 0 5 0",
        "enqueue 1 0 2"]


@pytest.mark.parametrize("batch", ["1", "32"])
def test_an_output_overflowed_in_place_later_is_blamed_on_the_in_place_op(out, tmp_path, batch):
    # y = a * a is finite; y.mul_(40000) overflows it. Held back for a
    # batch, y's check must be enqueued before the mul_ writes (the
    # stand-in, like the kernel, reads the memory when enqueued): else it
    # would read the inf and the origin would be the mul. (a, made where
    # nanhunt does not look, is checked at the mul's read: op by op, apart
    # from the mul's strided output.)
    calls = run_logged(["in-place"], out, tmp_path, NANHUNT_GPU_BATCH=batch)
    assert view_json(out)["first_origin"]["op"] == "aten::mul_"
    assert calls == (["enqueue 0 0 1"] * 3 if batch == "1" else
                     ["enqueue 0 0 2", "enqueue 0 0 1"])


@pytest.mark.parametrize("batch", ["1", "32"])
def test_casts_and_fills_are_checked_once_by_the_op_that_returns_them(out, tmp_path, batch):
    # x.to(fp16) of 100000 (an fp32 add's result), then that tensor's
    # zero_, an add_ into it that overflows, and a torch.zeros. The copy_
    # inside _to_copy and the fill_ inside zero_ (and zeros) write what the
    # enclosing op returns: one check each covers them (a launch a cast,
    # not two; one a zeros, not three). The cast is named, judged by its
    # fp32 input, as the CPU path names it (not the copy_, whose other input
    # is the fresh tensor's garbage); the zero_'s check makes the add_ into
    # its zeros an origin too, not the cast's inf passed on.
    calls = run_logged(["casts-and-fills"], out, tmp_path, NANHUNT_GPU_BATCH=batch)
    origins = [(f["op"], f["dtype"]) for f in findings(out, "origin")]
    assert origins == [("aten::_to_copy", "float16"), ("aten::add_", "float16")], origins
    first = view_json(out)["first_origin"]
    assert first["inputs"].startswith("#0 Float[8, 8] on the GPU"), first["inputs"]
    # Batches: the zero_ overwrites the cast's held result, and the add_
    # the zero_'s: each sends what is held first. The two operands made
    # where nanhunt does not look (the fp32 add's, the add_'s) are checked
    # with their first reader's outputs.
    assert calls == (["enqueue 0 0 2", "enqueue 0 0 1", "enqueue 0 0 1", "enqueue 0 0 2",
                      "enqueue 0 0 1"] if batch == "1" else
                     ["enqueue 0 0 3", "enqueue 0 0 1", "enqueue 0 0 3"])
    (trace,) = sorted(out.glob("*.sqlite"))
    rows = sqlite3.connect(trace).execute(
        "SELECT op, elements, posinf FROM op_stats ORDER BY op").fetchall()
    assert rows == [("aten::_to_copy", 64, 64), ("aten::add", 64, 0), ("aten::add_", 64, 64),
                    ("aten::zero_", 64, 0), ("aten::zeros", 64, 0)]


@pytest.mark.parametrize("batch", ["1", "32"])
def test_masks_of_finfo_min_are_known_by_their_memory_when_results_arrive(out, batch):
    # fp32 scores masked_fill'ed with torch.finfo(torch.float32).min, then
    # cast to fp16: -inf from finite values, judged after the fact by what
    # the masked_fill's result left in the registry. And torch.where
    # placing fp16's own 65504. And an additive mask, (1.0 - keep) * -1e9,
    # whose number, a host tensor torch wrapped it into, is past fp16's
    # range. Masks: no origin, no warning.
    r = run_gpu_ops(["mask-constants"], out, STAND_IN_PRELOAD, NANHUNT_GPU_BATCH=batch)
    assert r.returncode == 0, r.stderr
    assert "masked 3 ways" in r.stdout
    assert "warning:" not in r.stderr and "first non-finite" not in r.stderr, r.stderr
    assert [f for f in findings(out) if f["kind"] != "underflow"] == []
    j = view_json(out)
    assert j["first_origin"] is None and j["warnings"] == []
    assert sorted(j["mask_ops"]) == ["aten::_to_copy", "aten::mul"], j["mask_ops"]
    (trace,) = sorted(out.glob("*.sqlite"))
    assert sqlite3.connect(trace).execute(
        "SELECT detail FROM events WHERE kind = 'mask_literal_past_range'").fetchall() == [
            ("step 0: aten::mul made -inf of the program's 1e+09, past float16's largest value "
             "(65504)",)]


def test_a_non_blocking_copy_to_the_host_is_not_judged_by_what_was_there(out):
    # buffer.copy_(gpu_fp16, non_blocking=True) into a fp32 host buffer
    # holding NaN from before: at the op's end the GPU has not copied yet.
    # Scanned then, the stale NaN would be a false origin; it is counted
    # unchecked, and said why.
    r = run_gpu_ops(["async-copy"], out, STAND_IN_PRELOAD)
    assert r.returncode == 0, r.stderr
    assert "copied finite values" in r.stdout
    assert findings(out) == []
    report = view_json(out)
    assert report["first_origin"] is None
    assert [(u["op"], u["reason"], u["outputs"]) for u in report["unchecked_ops"]] == [
        ("aten::copy_", "copied_from_gpu_async", 1)]
    assert "non_blocking=True" in meta(out)["unchecked_reason"]


def test_results_that_arrive_steps_late_count_in_their_own_steps(out):
    # HOST_GPU_LAG holds every result back until the drain at exit, as a
    # GPU far behind the host would: each op's statistics still belong to
    # the step it ran in, in op_stats and in the steps table.
    r = run_gpu_ops(["overflow", "3", "5"], out, STAND_IN_PRELOAD, HOST_GPU_LAG="1000")
    assert r.returncode == 0, r.stderr
    (trace,) = sorted(out.glob("*.sqlite"))
    db = sqlite3.connect(trace)
    mul = db.execute("SELECT step, SUM(calls), SUM(elements), SUM(posinf) FROM op_stats "
                     "WHERE op = 'aten::mul' GROUP BY step ORDER BY step").fetchall()
    assert mul == [(0, 1, 256, 0), (1, 1, 256, 0), (2, 1, 256, 0), (3, 1, 256, 256),
                   (4, 1, 256, 0)]
    origins = db.execute("SELECT step, SUM(origins) FROM steps GROUP BY step "
                         "ORDER BY step").fetchall()
    assert origins == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 0)]
    first = view_json(out)["first_origin"]
    assert (first["op"], first["step"]) == ("aten::mm", 3), first


def steps_of(out):
    (trace,) = sorted(out.glob("*.sqlite"))
    return sqlite3.connect(trace).execute(
        "SELECT step, SUM(ops), SUM(nonfinite_ops) FROM steps GROUP BY step "
        "ORDER BY step").fetchall()


@pytest.mark.parametrize("batch", ["1", "32"])
def test_a_loss_scaler_of_the_programs_own_is_followed_on_a_gpu(out, batch):
    # The program reads its verdict on the gradients from the GPU (.item())
    # and skips the update of iterations 0, 1 and 4, freeing the gradients.
    # HOST_GPU_LAG keeps every result back, as a GPU behind the host: only
    # the delivery before the next iteration's first op, which the read
    # allows, lets its overflowed gradients judge that iteration.
    r, report = run_held_back(["own-loss-scaler"], out, batch)
    assert "the program skipped 3 updates" in r.stderr, r.stderr
    assert report["program_skipped_steps"] == [0, 1, 4], report["program_skipped_steps"]
    assert report["steps"] == 8
    assert report["diagnosis"]["title"] == (
        "Healthy: every inf/NaN was in gradients the program's loss scaler skipped")
    first = report["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::mm", "backward", 0), first
    # Each iteration a step of its own, its overflow in it, from its first
    # op on (a composite linear on the GPU, then a mul).
    assert [nonfinite for _, _, nonfinite in steps_of(out)] == [1, 1, 0, 0, 1, 0, 0, 0]
    (trace,) = sorted(out.glob("*.sqlite"))
    muls = sqlite3.connect(trace).execute(
        "SELECT step, SUM(calls) FROM op_stats WHERE op = 'aten::mul' GROUP BY step "
        "ORDER BY step").fetchall()
    assert muls == [(step, 1) for step in range(8)], muls


@pytest.mark.parametrize("batch", ["1", "32"])
@pytest.mark.parametrize("iterations", ["later", "first"])
def test_an_iteration_given_up_on_a_gpu_is_a_step_of_its_own(out, batch, iterations):
    # Every result held back (HOST_GPU_LAG), as a GPU behind the host: only
    # the delivery at the next batch's first op, which the program's read of
    # its loss allows, tells that iterations 3 and 4 made inf before the
    # program gave them up. first: iterations 0 and 1, before anything
    # trained, when nanhunt counts forward passes (a delivery before each).
    given_up = [0, 1] if iterations == "first" else [3, 4]
    r, report = run_held_back(["given-up"] + (["first"] if iterations == "first" else []), out,
                              batch)
    assert "gave up 2 iterations" in r.stdout, r.stdout
    assert report["steps"] == 8, report["steps"]
    assert report["given_up_steps"] == given_up, report["given_up_steps"]
    assert report["nonfinite_steps"] == given_up, report["nonfinite_steps"]
    first = report["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::mul", "forward",
                                                            given_up[0]), first


@pytest.mark.parametrize("batch", ["1", "32"])
def test_a_gans_generator_joins_its_discriminators_step_with_results_late(out, batch):
    # Each GAN update's forward pass begins a step; the generator's joins
    # the discriminator's when its optimizer is named. Every result held
    # back (HOST_GPU_LAG): the generator's, enqueued under the step its
    # forward pass began, arrive after that renumbering and must land in
    # the step it joined, its overflow in iteration 1 at step 1.
    r, report = run_held_back(["gan"], out, batch)
    assert "trained 4 iterations" in r.stdout, r.stdout
    assert report["steps"] == 4, report["steps"]
    assert report["nonfinite_steps"] == [1], report["nonfinite_steps"]
    first = report["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::mul", "forward", 1), first
    (trace,) = sorted(out.glob("*.sqlite"))
    muls = sqlite3.connect(trace).execute(
        "SELECT step, SUM(calls), SUM(posinf) FROM op_stats WHERE op = 'aten::mul' "
        "GROUP BY step ORDER BY step").fetchall()
    assert muls == [(0, 2, 0), (1, 2, 16), (2, 2, 0), (3, 2, 0)], muls


def test_no_wait_for_results_on_a_stream_that_captures_a_graph(out, tmp_path):
    # An iteration's first op on a capturing stream: waiting for the GPU
    # there would end the capture, so its results are not waited for (the
    # stand-in logs each wait) and those skips go unjudged.
    calls = run_logged(["own-loss-scaler", "captured"], out, tmp_path, HOST_GPU_LAG="100000")
    assert "drain" not in calls, calls
    assert view_json(out)["program_skipped_steps"] == []


def test_gradients_held_for_the_next_micro_batch_are_no_skip_on_a_gpu(out):
    # Two micro-batches an update; the first one's gradient overflows and
    # is held (as .grad holds it) when the second begins: a micro-batch,
    # judged by the weak reference the GPU path keeps to each output's
    # storage. After the second, the program frees it and skips update 0.
    r = run_gpu_ops(["own-loss-scaler", "accumulate"], out, STAND_IN_PRELOAD,
                    HOST_GPU_LAG="100000")
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    assert report["program_skipped_steps"] == [0], report["program_skipped_steps"]
    steps = steps_of(out)
    assert [step for step, _, _ in steps] == [0, 1, 2, 3]
    # Two micro-batches a step (step 0 also has the set-up's ops).
    assert len({ops for _, ops, _ in steps[1:]}) == 1, steps
    assert steps[0][2] == 1


def dropped_steps(out):
    (trace,) = sorted(out.glob("*.sqlite"))
    return [int(detail.split(":")[0].split()[1]) for (detail,) in sqlite3.connect(trace).execute(
        "SELECT detail FROM events WHERE kind = 'nonfinite_dropped' ORDER BY time")]


@pytest.mark.parametrize("mode,lag", [("dropped", "4"), ("kept", "4"), ("dropped", "100000")])
def test_a_gpu_steps_inf_nan_dropped_within_it_are_judged_once_its_results_are_in(
        out, tmp_path, mode, lag):
    # padded_attention_by_hand.py's softmax on a GPU: NaN over a fully
    # masked row every step, zeroed right after; each step's results come
    # in after its optimizer step ended. Once they are in, and the program
    # has trained on, no tensor holds the NaN: dropped, healthy. Kept in a
    # list, it is held: the softmax's own NaN, not an fp16 overflow (no
    # fp32 recomputation on a GPU, but a softmax cannot overflow). Results
    # that come in only at exit, when the program's tensors are going
    # anyway, give no verdict.
    calls = run_logged(["dropped", *(["kept"] if mode == "kept" else [])], out, tmp_path,
                       HOST_GPU_LAG=lag)
    report = view_json(out)
    first = report["first_origin"]
    assert (first["op"], first["step"]) == ("aten::_softmax", 0), first
    d = report["diagnosis"]
    if (mode, lag) == ("dropped", "4"):
        assert d["title"].startswith("Healthy: the inf/NaN made in each step were dropped"), d
        assert any("in 4 of 4 steps" in e for e in d["evidence"]), d
        assert dropped_steps(out) == [0, 1, 2, 3]
    else:
        assert d["title"] == ("Not an fp16 overflow: aten::_softmax made inf/NaN from finite "
                              "inputs at step 0"), d
        assert dropped_steps(out) == []
    # A step makes 4 results (its scores, made where nanhunt does not look,
    # checked at the masked_fill's read, and 3 outputs). Step 0 was judged
    # when its results came in, in step 1; from then on, a step that
    # updated having made NaN, each optimizer step's end waits for the
    # results (steps 1 to 3), and its verdict is given there.
    assert calls.count("drain") == (0 if lag == "100000" else 3), calls


def test_gpu_ops_leave_the_program_bit_identical(out):
    plain = run([PROGRAM, "overflow", "3", "6"])
    monitored = run_gpu_ops(["overflow", "3", "6"], out, STAND_IN_PRELOAD)
    assert plain.returncode == monitored.returncode == 0, monitored.stderr
    assert plain.stdout == monitored.stdout


def test_checks_held_back_for_batches_find_the_same_origin(out):
    r = run_gpu_ops(["overflow", "3", "6"], out, STAND_IN_PRELOAD, NANHUNT_GPU_BATCH="32")
    assert r.returncode == 0, r.stderr
    first = view_json(out)["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::mm", "forward", 3), first
    m = meta(out)
    assert int(m["device_checks"]) == 6 * (GPU_OPS_A_STEP + FIRST_READS_A_STEP)
    assert 0 < int(m["device_check_batches"]) < 6 * GPU_OPS_A_STEP


def test_ops_on_a_capturing_stream_are_named_unchecked(out):
    r = run_gpu_ops(["capture"], out, STAND_IN_PRELOAD)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    unchecked = {(u["op"], u["reason"]): u["outputs"] for u in report["unchecked_ops"]}
    assert unchecked == {("aten::mm", "graph_capture"): 1, ("aten::add", "graph_capture"): 1}
    # Before and after the capture, and the operand's first read before it.
    assert int(meta(out)["device_checks"]) == 3
    assert any("captured into CUDA graphs" in p and "aten::mm" in p for p in report["problems"])


def test_a_held_output_whose_memory_went_is_dropped_and_named(out):
    r = run_gpu_ops(["released"], out, STAND_IN_PRELOAD, NANHUNT_GPU_BATCH="32")
    assert r.returncode == 0, r.stderr
    unchecked = [(u["op"], u["reason"], u["outputs"]) for u in view_json(out)["unchecked_ops"]]
    assert unchecked == [("aten::mul", "released_before_check", 1)]


@pytest.mark.skipif(not (BUILD / "lib" / "libnanhunt_cuda.so").exists(),
                    reason="built without the CUDA toolkit")
def test_without_a_driver_the_real_library_steps_aside_and_says_so(out):
    # The real libnanhunt_cuda.so loads without a driver: GPU outputs go
    # unchecked, named, and the program runs on untouched.
    plain = run([PROGRAM, "overflow", "3", "4"])
    r = run_gpu_ops(["overflow", "3", "4"], out, LIBNANHUNT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout
    report = view_json(out)
    # Each check is refused by CUDA (no driver): said once when it happens,
    # with CUDA's reason, and again, with the ops, at exit.
    unchecked = {(u["op"], u["reason"]): u["outputs"] for u in report["unchecked_ops"]}
    assert unchecked == {("aten::mm", "not_enqueued"): 4, ("aten::add", "not_enqueued"): 4,
                         ("aten::mul", "not_enqueued"): 4}
    assert r.stderr.count("nanhunt: a GPU check could not be enqueued (") == 1, r.stderr
    exit_line = next(l for l in r.stderr.splitlines() if "NOT checked" in l)
    assert "could not be enqueued: " in exit_line and "aten::mm (forward) 4" in exit_line


@pytest.mark.parametrize("where", ["backward", "forward"])
def test_kernel_names_start_for_what_the_user_must_find_not_for_a_scalers_gradients(out, where):
    # A GradScaler scales gradients up to fp16's limit, and past it, on
    # purpose: a GPU matmul of them near the limit, then at inf, is in the
    # trace but starts no kernel names, whose CUPTI callback would cost on
    # every launch from then on. The same matmul in the forward pass does.
    r = run_gpu_ops(["scaled-gradients", *(["forward"] if where == "forward" else [])], out,
                    STAND_IN_PRELOAD)
    assert r.returncode == 0, r.stderr
    mm = [(f["kind"], f["phase"], f["step"]) for f in findings(out)
          if f["op"] == "aten::mm" and f["kind"] in ("near_max", "origin")
          and f["dtype"] == "float16"]
    assert mm == [("near_max", where, 1), ("origin", where, 2)], mm
    names = meta(out)["kernel_names_off"]
    if where == "backward":
        assert names == "auto: no result came near fp16's limit or non-finite", names
    else:  # started: the stand-in has no CUPTI to start
        assert names == "this libnanhunt_cuda.so has no CUPTI support", names


@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
@pytest.mark.parametrize("loaded", ["host", "gpu"])
def test_a_checkpoint_loaded_with_nan_is_named_by_the_gpu_parameter_it_went_into(
        out, loaded, named):
    # torch.load(map_location="cpu"), then load_state_dict: the copy_ into
    # the GPU parameter reads the host tensor at enqueue, and names it by
    # the parameter it writes (no Python here: "parameter"). It was "came
    # in with the data". Loaded straight onto the GPU (torch.load copies
    # the bytes as uint8), the copy_'s source was once never read (the
    # copy_ was its origin, "not an fp16 overflow"); then inferred to hold
    # what the copy made; now read at its first read. `named`: the parameter's
    # name told to nanhunt around the copy, as step_guard.py's
    # load_state_dict wrapper does, is the one it is called by.
    r = run_gpu_ops(["load-checkpoint", *(["gpu"] if loaded == "gpu" else ["host"]),
                     *(["named"] if named else [])], out, STAND_IN_PRELOAD)
    assert r.returncode == 0, r.stderr
    j = view_json(out)
    first = j["first_origin"]
    assert (first["kind"], first["op"]) == ("input", "aten::copy_"), first
    into = "parameter 0.weight" if named else "parameter"
    assert f"#1 Half[4, 8] (copied into {into}) max|x|=0.25 nan=1" in first["inputs"], first
    assert f"input of aten::copy_ (forward) at step 0, copied into {into} — " in r.stderr, \
        r.stderr
    # Loaded straight onto the GPU, the source is memory no op nanhunt saw
    # write values (torch.load copies its bytes as uint8): checked where the
    # copy_ first reads it, so its NaN is counted, not inferred.
    assert meta(out).get("inputs_checked_at_first_read") == ("1" if loaded == "gpu" else None)
    assert [f["kind"] for f in findings(out) if f["kind"] != "propagated"] == ["input"]
    d = j["diagnosis"]
    assert d["title"] == "The model's parameters were loaded with NaN; the data is not to blame", d


@pytest.mark.parametrize("read", [True, False], ids=["read", "unread"])
@pytest.mark.parametrize("mode,op,phase,named,then,title,counted,unread_kind", [
    # A resumed Adam's exp_avg_sq, loaded straight onto the GPU with an
    # inf: optimizer.load_state_dict keeps it as it is, and the update's
    # mul_ is its first reader. The step guard reads the state before the
    # optimizer's first step.
    ("loaded-state", "aten::mul_", "optimizer",
     "#0 Float[4, 4] (Adam state exp_avg_sq of a parameter) max|x|=inf +inf=1",
     "aten::addcmul_", "The optimizer's state brought inf, not the data",
     "loaded_optimizer_state_nonfinite", "origin"),
    # model.load_state_dict(..., assign=True): the parameter is the loaded
    # tensor itself, with a NaN, and the first forward pass's mm its first
    # reader ("Forward overflow" when unread). The step guard's
    # load_state_dict wrapper reads what a module was assigned.
    ("loaded-parameter", "aten::mm", "forward",
     "#1 Half[8, 4] (parameter 0.weight) max|x|=0.25 nan=1",
     "aten::relu", "The model's parameters brought NaN, not the data",
     "loaded_model_tensors_nonfinite", "input"),
], ids=["optimizer-state", "assigned-parameter"])
def test_a_tensor_loaded_with_inf_or_nan_onto_the_gpu_is_an_input_not_its_readers_origin(
        out, read, mode, op, phase, named, then, title, counted, unread_kind):
    # No op of this run wrote it (torch.load copies a GPU checkpoint's
    # bytes as uint8), and its first reader's check reads what that op
    # wrote, not what it read: the reader was called its origin. Told to
    # nanhunt (here, as step_guard.py would), it is an input, named, and
    # the op after passes it on. Unread: the mm's first read of the
    # parameter is checked (an input, unnamed); Adam's mul_ writes the
    # state it reads, which no check after it can read as it was (origin).
    r = run_gpu_ops([mode, *([] if read else ["unread"])], out, STAND_IN_PRELOAD)
    assert r.returncode == 0, r.stderr
    j = view_json(out)
    first = j["first_origin"]
    if not read:
        assert (first["kind"], first["op"], first["phase"]) == (unread_kind, op, phase), first
        if unread_kind == "input":
            assert named.replace(" (parameter 0.weight)", "") in first["inputs"], first
        assert counted not in meta(out)
        return
    assert (first["kind"], first["op"], first["phase"], first["step"]) == (
        "input", op, phase, 0), first
    assert named in first["inputs"], first
    assert [(f["op"], f["kind"]) for f in findings(out)] == [
        (op, "input"), (then, "propagated")]
    tensor = named.split(" (", 1)[1].split(")")[0]
    assert f"input of {op} ({phase}) at step 0, in {tensor}" in r.stderr, r.stderr
    assert j["diagnosis"]["title"] == title, j
    loaded = {k: v for k, v in meta(out).items() if k.startswith("loaded_")}
    assert loaded == {counted: "1"}, loaded


@pytest.mark.parametrize("mode", ["check", "sample", "batch"])
def test_gpu_memory_no_op_wrote_is_checked_where_an_op_first_reads_it(out, tmp_path, mode):
    # fp16 memory no op nanhunt saw wrote (a CUDA extension's kernel, a
    # DLPack import, a torch.compile region, torch.load's bytes), with an
    # inf in row 6. One mm reads rows 0-3, another rows 4-7; each read of a
    # part is checked, and the weight, read whole, once. The inf is the
    # second mm's input: the first finding and the diagnosis blame what
    # came in, and the add after it passes it on.
    # Sample mode checks no first reads (an op it did not sample may have
    # written the memory): there, as before, the mm is its origin.
    # With NANHUNT_GPU_BATCH the first reads are held with the outputs and
    # judged the same.
    settings = {"sample": {"NANHUNT_MODE": "sample", "NANHUNT_SAMPLE_OPS": "1"},
                "batch": {"NANHUNT_GPU_BATCH": "32"}}.get(mode, {})
    calls = run_logged(["unwritten"], out, tmp_path, **settings)
    j = view_json(out)
    first = j["first_origin"]
    if mode == "sample":
        assert (first["kind"], first["op"]) == ("origin", "aten::mm"), first
        assert "inputs_checked_at_first_read" not in meta(out)
        return
    assert (first["kind"], first["op"], first["call_index"]) == ("input", "aten::mm", 2), first
    assert first["inputs"].startswith("#0 Half[4, 4] max|x|=inf +inf=1; #1 Half[4, 4] on the GPU"), \
        first
    assert [(f["op"], f["kind"]) for f in findings(out)] == [
        ("aten::mm", "input"), ("aten::add", "propagated")]
    assert j["diagnosis"]["title"] == "Non-finite values came in with the data, not from an op", j
    assert int(meta(out)["inputs_checked_at_first_read"]) == 3
    if mode == "batch":
        # Held with the outputs: all six checks in the batch the exit enqueues.
        assert calls == ["enqueue 0 0 6"], calls
        return
    # Checked beside their reader's output: the first mm's two operands and
    # output in one launch, the second's rows and output in another.
    assert calls == ["enqueue 0 0 3", "enqueue 0 0 2", "enqueue 0 0 1"]
