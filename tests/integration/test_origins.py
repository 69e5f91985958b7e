"""Which op nanhunt names as the first origin, in real torch programs."""
import sqlite3

import pytest
from conftest import (DEMO, NANHUNT, PYTHON, SCRIPTS, compiled_runs, findings, nanhunt_run,
                      plain_and_monitored, preload_run, preload_script, run, view_json)


def test_fp16_dot_overflow_is_an_origin_with_positive_infinity(out):
    r = preload_run([PYTHON, SCRIPTS / "overflow_dot.py"], out)
    assert r.returncode == 0, r.stderr
    first = view_json(out)["first_origin"]
    assert first["kind"] == "origin"
    assert first["op"] == "aten::dot"
    assert first["top_op"] == "aten::matmul"
    assert first["phase"] == "forward"
    assert first["dtype"] == "float16"
    assert first["posinf"] == 1 and first["nan"] == 0
    assert first["fp32_max_abs"] == 360000.0
    assert first["source"].endswith("overflow_dot.py:5 in <module>")
    # The live line on stderr says the same.
    assert "origin aten::dot (forward) at step 0" in r.stderr


def test_softmax_of_inf_is_propagated_from_a_non_finite_input(out):
    r = preload_run([PYTHON, SCRIPTS / "softmax_inf.py"], out)
    assert r.returncode == 0, r.stderr
    assert "nan" in r.stdout
    origins = findings(out, "origin")
    assert origins == [], origins
    softmax = [f for f in findings(out, "propagated") if f["op"] == "aten::_softmax"]
    assert softmax and softmax[0]["nan"] == 2
    assert "+inf=1" in softmax[0]["inputs"]
    first = view_json(out)["first_origin"]
    assert first["kind"] == "input", first


def test_demo_origin_is_the_attention_matmul_with_scores_past_fp16_max(out):
    r = nanhunt_run([PYTHON, DEMO, "--steps", "44"], out)
    assert r.returncode == 0, r.stderr
    assert "loss nan" in r.stdout
    report = view_json(out)
    first = report["first_origin"]
    assert first["kind"] == "origin"
    assert (first["op"], first["top_op"]) == ("aten::bmm", "aten::matmul")
    assert first["phase"] == "forward"
    assert first["dtype"] == "float16"
    assert first["max_abs"] > 65504
    assert "train.py:30 in forward" in first["source"]
    # Warned before it overflowed: the same op, steps earlier.
    warned = [w for w in report["warnings"]
              if w["op"] == "aten::bmm" and w["step"] < first["step"]]
    assert warned, report["warnings"]
    # The summary printed by `nanhunt run` names it too.
    assert "origin  aten::bmm (in aten::matmul)  forward" in r.stderr


def test_backward_only_overflow_is_reported_in_backward_with_its_forward_op(out):
    r = preload_run([PYTHON, SCRIPTS / "backward_overflow.py"], out)
    assert r.returncode == 0, r.stderr
    assert "forward max 5000" in r.stdout
    first = view_json(out)["first_origin"]
    assert first["kind"] == "origin"
    assert first["phase"] == "backward"
    assert first["forward_op"] == "aten::div"
    assert first["posinf"] + first["neginf"] > 0


def test_a_recurring_backward_overflow_names_the_line_of_its_forward_op(out):
    # GradScaler's scaled gradients overflow in backward at 18 of 20 steps.
    # A backward op runs after its forward op's line is gone, so nanhunt
    # captures the forward op's line once a backward op of it overflowed or
    # came near the limit: the later findings have the line of the forward
    # op (the out.float() cast's backward) as they come, the first one gets
    # it from the same call in step 1.
    script = SCRIPTS / "oscillating_scaler.py"
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    lines = script.read_text().splitlines()
    cast = f"{script}:{lines.index('    loss = torch.nn.functional.mse_loss(out.float(), y)') + 1} in <module>"
    origins = [f for f in findings(out, "origin") if f["phase"] == "backward"]
    assert origins[0]["step"] == 0 and origins[0]["source"] == cast, origins[0]
    later = [f for f in origins if f["step"] > 0 and f["op"] == "aten::_to_copy"]
    assert later and all(f["forward_op"] == "aten::_to_copy" for f in later), later
    assert all(f["source"] == cast for f in later), [f["source"] for f in later]
    first = view_json(out)["first_origin"]
    assert first["step"] == 0 and first["source"] == cast, first
    text = run([NANHUNT, "view", out]).stdout
    assert "forward op called at (lines of this backward op's findings" not in text, text


@pytest.mark.parametrize("mode", ["", "branch", "checked"])
def test_a_backward_overflow_that_never_recurs_names_its_forward_line(mode, out):
    # The first backward overflow is often the last one with a line to find:
    # its NaN only propagates after it. The line comes from the division's
    # call in step 4, the step's first division as in step 3. Counted by
    # name, the nodes of other ops that come between steps change nothing:
    # an extra aten::mul from step 4 on ("branch"), or a check of the
    # weights with grad on after each update, whose nodes begin the next
    # step ("checked"); by number, another op's line, or none, was taken.
    script = SCRIPTS / "backward_overflow_once.py"
    r = preload_run([PYTHON, script] + ([mode] if mode else []), out)
    assert r.returncode == 0, r.stderr
    division = f"{script}:{script.read_text().splitlines().index('    y = x / (w * shrink)') + 1} in <module>"
    first = view_json(out)["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::div", "backward", 3), first
    assert first["forward_op"] == "aten::div" and first["source"] == division, first
    assert f"was called at {division}: the line of the same call in step 4" in r.stderr, r.stderr
    evidence = view_json(out)["diagnosis"]["evidence"]
    assert any(f"(backward of aten::div, called at {division})" in e for e in evidence), evidence


@pytest.mark.parametrize("cast", [False, True], ids=["float32", "cast"])
def test_nan_planted_in_the_data_batch_is_reported_as_input(out, cast):
    # Cast with .float(), the first op to see the NaN is the _to_copy inside
    # aten::to, which is never judged (a view of its _to_copy's result): the
    # NaN was left to it, recorded as propagated from nobody, and the run
    # was diagnosed healthy.
    r = preload_run([PYTHON, SCRIPTS / "nan_in_batch.py"] + (["cast"] if cast else []), out)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    first = report["first_origin"]
    assert first["kind"] == "input", first
    assert first["step"] == 2
    assert first["nan"] > 0
    if cast:
        assert (first["op"], first["top_op"]) == ("aten::_to_copy", "aten::to"), first
        assert first["source"].endswith("nan_in_batch.py:21 in <module>"), first
    assert findings(out, "origin") == []
    assert report["diagnosis"]["title"] == "Non-finite values came in with the data, not from an op"


def test_a_cast_overflow_in_a_checkpointed_block_is_named_in_forward(out):
    # Activation checkpointing runs the block's forward ops again during
    # backward: the origin is still the forward cast at step 4, and what a
    # cast reaches in fp32 is its input's magnitude (a recomputation that
    # casts to fp16 again would only say inf).
    r = preload_run([PYTHON, SCRIPTS / "checkpointed_cast_overflow.py"], out)
    assert r.returncode == 0, r.stderr
    first = view_json(out)["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::_to_copy", "forward", 4)
    assert first["dtype"] == "float16"
    assert first["source"].endswith("checkpointed_cast_overflow.py:17 in forward")
    assert 1e6 < first["fp32_max_abs"] < 1e8, first["fp32_max_abs"]
    # The program's own cast: no op to run in fp32; keep the tensor wider,
    # or tame the op that made the values.
    d = view_json(out)["diagnosis"]
    assert d["kind"] == "forward_overflow"
    assert "cast to float16 at step 4" in d["title"]
    assert "cast finite values to float16 inf/NaN" in d["evidence"][0]
    assert d["evidence"][1].startswith("they were made by aten::mul (forward, float32")
    assert d["fixes"][0].startswith("keep this tensor in float32, or cast it to bfloat16")
    assert not any("NANHUNT_FP32_OPS" in fix for fix in d["fixes"])


def test_an_overflow_inside_an_autograd_function_is_in_the_forward_pass(out, tmp_path):
    # autograd.Function runs its forward with grad mode off, as torch.compile
    # runs its graphs: after the first backward that looked like the
    # update, and the overflow at step 2 was reported in "optimizer".
    preload_script(
        tmp_path / "function_overflow.py",
        "import torch\n"
        "class Project(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x, w):\n"
        "        ctx.save_for_backward(x, w)\n"
        "        return x @ w\n"
        "    @staticmethod\n"
        "    def backward(ctx, g):\n"
        "        x, w = ctx.saved_tensors\n"
        "        return g @ w.t(), x.t() @ g\n"
        "torch.manual_seed(0)\n"
        "w = torch.nn.Parameter((torch.randn(16, 16) * 0.1 + 1).half())  # columns sum to ~16\n"
        "opt = torch.optim.SGD([w], lr=1e-3)\n"
        "for step in range(4):\n"
        "    x = torch.full((8, 16), 8000.0 if step == 2 else 0.01, dtype=torch.float16)\n"
        "    opt.zero_grad()\n"
        "    Project.apply(x, w).float().sum().backward()\n"
        "    opt.step()\n", out)
    first = view_json(out)["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::mm", "forward", 2), first
    assert first["top_op"] == "Project", first


def test_a_copy_into_a_buffer_that_held_inf_is_judged_by_its_source(out, tmp_path):
    # copy_ overwrites its destination whole: the inf the buffer held from
    # an earlier overflow is no input of it. Its own overflow (fp32 100000
    # into fp16) is an origin, not that old inf passed on.
    preload_script(
        tmp_path / "copy_into_stale_buffer.py",
        "import torch\n"
        "half = torch.full((4,), 300.0, dtype=torch.float16)\n"
        "buf = half * half  # 90000: inf in fp16, an origin\n"
        "src = torch.full((4,), 100000.0)\n"
        "buf.copy_(src)  # inf again, from finite fp32 values\n", out)
    origins = [(f["op"], f["dtype"]) for f in findings(out, "origin")]
    assert origins == [("aten::mul", "float16"), ("aten::copy_", "float16")], origins
    copy = findings(out, "origin")[1]
    assert "#0" not in copy["inputs"] and copy["inputs"].startswith("#1 float32[4]"), copy["inputs"]


def test_an_overflow_in_an_optimizer_closure_is_in_the_forward_pass(out, tmp_path):
    # LBFGS re-evaluates the loss in a closure inside its step, with grad
    # mode on: that is a forward pass, not the update (it was "optimizer").
    preload_script(
        tmp_path / "closure_overflow.py",
        "import torch\n"
        "torch.manual_seed(0)\n"
        "w = torch.nn.Parameter(torch.full((16, 16), 1.0, dtype=torch.float16))\n"
        "opt = torch.optim.LBFGS([w], max_iter=3)\n"
        "for step in range(3):\n"
        "    x = torch.full((8, 16), 8000.0 if step == 1 else 0.01, dtype=torch.float16)\n"
        "    def closure():\n"
        "        opt.zero_grad()\n"
        "        loss = (x @ w).float().square().mean()\n"
        "        loss.backward()\n"
        "        return loss\n"
        "    opt.step(closure)\n", out)
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::mm", "forward", 1), first
    assert first["source"].endswith("closure_overflow.py:9 in closure"), first
    assert j["steps"] == 3
    assert j["program_skipped_steps"] == []


def assert_four_steps_of_the_same_ops(out):
    # Step 0 may hold more: what torch does once, at its first optimizer
    # step (torch 2.7 imports torch._dynamo there, whose import runs 41
    # tensor ops; torch 2.15 runs the same ops in every step).
    [trace] = out.glob("*.sqlite")
    steps = sqlite3.connect(trace).execute(
        "SELECT step, SUM(ops) FROM steps GROUP BY step ORDER BY step").fetchall()
    assert [s for s, _ in steps] == [0, 1, 2, 3]
    ops = [n for _, n in steps]
    assert len(set(ops[1:])) == 1 and ops[0] >= ops[1], steps


@pytest.mark.parametrize("overflow_step", [0, 2])
def test_an_overflow_in_a_later_micro_batch_is_in_its_optimizer_step(out, tmp_path,
                                                                     overflow_step):
    # Four micro-batches of gradient accumulation per optimizer step. Before
    # the first optimizer record, each later micro-batch looked like a new
    # step (numbers 1-3); its rows are renumbered when that record comes.
    preload_script(
        tmp_path / "accumulated_overflow.py",
        "import torch\n"
        "w = torch.nn.Parameter(torch.full((16, 16), 1.0))\n"
        "opt = torch.optim.SGD([w], lr=1e-3)\n"
        "for step in range(4):\n"
        "    opt.zero_grad()\n"
        "    for micro_batch in range(4):\n"
        f"        big = step == {overflow_step} and micro_batch == 2\n"
        "        x = torch.full((8, 16), 8000.0 if big else 0.01)\n"
        "        with torch.autocast('cpu', dtype=torch.float16):\n"
        "            loss = (x @ w.half()).float().square().mean()\n"
        "        loss.backward()\n"
        "    opt.step()\n", out)
    j = view_json(out)
    first = j["first_origin"]
    # 8000 * 16 = 128000 > 65504
    assert (first["op"], first["phase"], first["step"]) == \
        ("aten::mm", "forward", overflow_step), first
    assert j["steps"] == 4
    # Each step holds its four micro-batches: the same ops every step.
    assert_four_steps_of_the_same_ops(out)


@pytest.mark.parametrize("layout", ["two-optimizers", "in-backward", "gan", "gan-gradscaler",
                                    "next-phase"])
@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_several_optimizer_steps_in_an_iteration_are_one_step(out, layout, phase):
    # The program's own loop counts iterations: an overflow in its third is
    # at step 2 however many optimizer records each iteration makes.
    r = preload_run([PYTHON, SCRIPTS / "several_optimizers.py", layout, phase], out)
    assert r.returncode == 0, r.stderr
    j = view_json(out)
    first = j["first_origin"]
    assert (first["phase"], first["step"]) == (phase, 2), first
    assert j["steps"] == 4
    if layout == "gan-gradscaler":
        # In backward GradScaler skips the generator alone: its skip, with
        # no record, still ends its update in the discriminator's step (the
        # next iteration read step 3 and called the skip the program's own).
        assert j["skipped_steps"] == [2], j["skipped_steps"]
        assert j["program_skipped_steps"] == [], j["program_skipped_steps"]
        assert j["nonfinite_steps"] == [2], j["nonfinite_steps"]
        return
    # Every iteration runs the same ops, whichever step the update's tail
    # and the backward ops between optimizer records would have fallen in
    # (a GAN's generator's forward pass began a step of its own, joined to
    # its discriminator's when the generator's optimizer stepped; a
    # fine-tuning's next phase has more ops).
    if layout != "next-phase":
        assert_four_steps_of_the_same_ops(out)


def test_a_gans_two_updates_are_one_step_each_after_its_forward_pass(out, tmp_path):
    # Discriminator, then generator, each after its own forward pass: one
    # step an iteration, as the loop counts (and as sample mode counts);
    # the generator's overflow in iteration 1 is step 1. Each update's
    # forward pass began a step; the generator's joined the discriminator's
    # when its optimizer, which had not stepped there, stepped.
    preload_script(
        tmp_path / "gan.py",
        "import torch\n"
        "g = torch.nn.Linear(8, 8)\n"
        "d = torch.nn.Linear(8, 1)\n"
        "opt_g = torch.optim.Adam(g.parameters(), lr=1e-4)\n"
        "opt_d = torch.optim.Adam(d.parameters(), lr=1e-4)\n"
        "for iteration in range(3):\n"
        "    noise = torch.randn(4, 8)\n"
        "    d(g(noise).detach()).mean().backward()\n"
        "    opt_d.step()\n"
        "    opt_d.zero_grad()\n"
        "    noise = noise * (1e5 if iteration == 1 else 1.0)\n"
        "    with torch.autocast('cpu', dtype=torch.float16):\n"
        "        fake = g(noise)\n"
        "    d(fake.float()).mean().backward()\n"
        "    opt_g.step()\n"
        "    opt_g.zero_grad()\n", out)
    j = view_json(out)
    first = j["first_origin"]
    assert (first["phase"], first["step"]) == ("forward", 1), first
    assert first["source"].endswith("gan.py:13 in <module>"), first
    assert j["steps"] == 3


def test_the_first_layers_overflow_is_in_the_step_its_forward_pass_begins(out, tmp_path):
    # A hand-written update (no optimizer record): the next forward pass
    # begins the step at its first op's start, so the addmm inside that
    # linear, which ends before it, is in the new step, not the last one.
    preload_script(
        tmp_path / "first_layer_overflow.py",
        "import torch\n"
        "torch.manual_seed(0)\n"
        "layer = torch.nn.Linear(16, 16)\n"
        "for step in range(5):\n"
        "    x = torch.full((8, 16), 1e5 if step == 3 else 0.1)\n"
        "    with torch.autocast('cpu', dtype=torch.float16):\n"
        "        y = layer(x)\n"
        "    y.float().mean().backward()\n"
        "    with torch.no_grad():\n"
        "        for p in layer.parameters():\n"
        "            p -= 1e-3 * p.grad\n"
        "            p.grad = None\n", out)
    j = view_json(out)
    first = j["first_origin"]
    assert (first["top_op"], first["phase"], first["step"]) == ("aten::linear", "forward", 3), first
    assert j["steps"] == 5


def test_backward_findings_of_a_custom_autograd_function_name_it(out):
    r = preload_run([PYTHON, SCRIPTS / "custom_function_overflow.py"], out)
    assert r.returncode == 0, r.stderr
    first = view_json(out)["first_origin"]
    assert (first["kind"], first["phase"], first["step"]) == ("origin", "backward", 0), first
    assert first["forward_op"] == "Blowup", first
    assert "backward of Blowup" in r.stderr, r.stderr
    # Its line is the one in the Function's backward that overflowed, and
    # the fix is autocast's decorators (no operator to list in
    # NANHUNT_FP32_OPS).
    assert first["source"].endswith("custom_function_overflow.py:15 in backward"), first
    text = run([NANHUNT, "view", out]).stdout
    assert "custom_function_overflow.py:15 in backward" in text
    assert "forward op called at" not in text, text
    fixes = view_json(out)["diagnosis"]["fixes"]
    assert any("@torch.amp.custom_fwd(" in fix for fix in fixes), fixes
    assert not any("NANHUNT_FP32_OPS=Blowup" in fix for fix in fixes), fixes


def test_an_overflow_in_a_gradient_hook_is_named_at_the_hooks_line(out):
    # Ops a hook runs in the backward pass have the hook's line, which was
    # left empty: backward ops had only their forward op's line.
    script = SCRIPTS / "gradient_hook_overflow.py"
    plain_and_monitored([PYTHON, script], out)
    report = view_json(out)
    first = report["first_origin"]
    assert (first["kind"], first["op"], first["phase"], first["step"]) == (
        "origin", "aten::mul", "backward", 2), first
    assert first["source"].endswith("gradient_hook_overflow.py:11 in <lambda>"), first
    assert "gradient_hook_overflow.py:11 in <lambda>" in report["diagnosis"]["evidence"][0]
    # (The ops of autograd's own nodes still have no line of their own, not
    # the loss.backward() call's: test_a_recurring_backward_overflow_...)


def test_an_overflow_inside_a_compiled_region_is_named_after_the_region(out, tmp_path):
    # torch.compile fuses the block's ops into kernels nanhunt does not see
    # one by one: the first checked op given the inf is the mean after it.
    # That is not "came in with the data": nanhunt names the region and
    # the line it was called from, and says how to find the op inside.
    script = SCRIPTS / "compiled_overflow.py"
    r, _ = compiled_runs(script, out, tmp_path)
    lines = script.read_text().splitlines()
    call = f"{script}:{lines.index('    y = block(x)') + 1} in <module>"
    report = view_json(out)
    first = report["first_origin"]
    assert (first["kind"], first["op"], first["phase"], first["step"]) == (
        "compiled", "aten::mean", "forward", 0), first
    assert first["compiled_region"] == f"Torch-Compiled Region: 0/0, called at {call}", first
    assert report["diagnosis"]["kind"] == "compiled_region", report["diagnosis"]
    assert any("TORCHDYNAMO_DISABLE=1" in f for f in report["diagnosis"]["fixes"])
    assert f"out of torch.compile's Torch-Compiled Region: 0/0, called at {call}" in r.stderr
    # The compiled backward's ops name the autograd.Function torch.compile
    # made (its record's name, once read after it had gone).
    backward = [f for f in findings(out) if f["phase"] == "backward"]
    assert backward and {f["forward_op"] for f in backward} == {"CompiledFunction"}, backward
    assert all(f["kind"] in ("compiled", "propagated") for f in backward), backward
