#!/usr/bin/env bash
# GPU check, on a machine with an NVIDIA GPU: builds nanhunt against that
# machine's torch and CUDA toolkit, runs the GPU tests (each check kernel
# against the CPU check, on random and edge-value tensors of every format,
# odd sizes, unaligned starts, strided views; the result ring; CUDA graph
# capture left intact), the kernel benchmark, the demo on CUDA under
# nanhunt (origin and kernel names), the GPT-2-small-sized training
# benchmark (bench/gpt2_bench.py), then, while time is left
# (GPU_CHECK_BUDGET_S), side streams and a second GPU, a whole training
# step captured into a CUDA graph and replayed under nanhunt (identical to
# unmonitored), checks held back for batches (NANHUNT_GPU_BATCH=32: the
# demo's origin and checks unchanged; tensors written in place after the
# op, on the same stream and on another), and the scenarios (raise, masks,
# optimizers, a loss scaler of the program's own, evaluation, given-up
# iterations, a checkpoint loaded onto the GPU), and prints a short table
# last. Debian packages that machine lacks come from .gpu-deps/ (made here
# by scripts/gpu-deps.sh).
# Meant to finish within 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${NANHUNT_PYTHON:-python3}
build=${GPU_BUILD_DIR:-build-gpu}
# GPU_CHECK_WITHOUT_GPU=1 runs every part on a machine without a GPU, for
# the kernels' architecture sm_90: each part that needs a GPU fails and is
# noted, and the script must still reach its summary
# (tests/integration/test_gpu_check_script.py). A lease is too scarce to
# find a broken script on.
without_gpu=${GPU_CHECK_WITHOUT_GPU:-0}
cuda_architectures=native
if [[ $without_gpu == 1 ]]; then
  cuda_architectures=90
fi

prefix=""
if ls .gpu-deps/*.deb >/dev/null 2>&1; then
  prefix=$PWD/.gpu-deps/root
  mkdir -p "$prefix"
  for deb in .gpu-deps/*.deb; do
    if command -v dpkg >/dev/null; then
      dpkg -x "$deb" "$prefix"
    else  # a .deb is an ar archive with its files in data.tar.*
      unpack=$(mktemp -d) && (cd "$unpack" && ar x "$OLDPWD/$deb") && tar -xf "$unpack"/data.tar.* -C "$prefix"
    fi
  done
  export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# CMake looks for nvcc on PATH only; the toolkit is usually at /usr/local/cuda.
if [[ -z ${CUDACXX:-} ]] && ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
generator=() keep_going=()  # every compile error of a build at once, not the first
command -v ninja >/dev/null && generator=(-G Ninja) keep_going=(-- -k 0)
echo "machine: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(c++ --version | head -1)," \
  "$(cmake --version | head -1), nvcc $("${CUDACXX:-nvcc}" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), $(nproc) cores"

# A failing part is noted and the script goes on: one device run should
# bring back every figure it can. The summary names what failed.
failed=()
# GPU_CHECK_BENCH="MODES ROUNDS" runs only the build and the GPT-2
# benchmark's MODES (bench/gpt2_bench.py --modes) over ROUNDS rounds: a
# second look at a figure when device time is short.
read -r bench_modes bench_rounds <<<"${GPU_CHECK_BENCH:-}"

# A part's header, with the seconds gone since the script started.
part() {
  echo "== $* [${SECONDS}s]"
}

# The device tool stops a command at 600 s, and with it the summary: the
# parts after the GPT-2 benchmark run only while fewer than
# GPU_CHECK_BUDGET_S seconds (default 420) have gone. Each part skipped
# is named in the summary, and the script does not pass.
budget=${GPU_CHECK_BUDGET_S:-420}
if [[ ! $budget =~ ^[0-9]+$ ]]; then
  echo "gpu-check: GPU_CHECK_BUDGET_S=$budget: not a whole number of seconds (default 420)" >&2
  exit 2
fi
skipped=()
part_name=""  # the part time_left let start: what its failure is noted as
time_left() {
  part_name=$1
  if ((SECONDS < budget)); then
    return 0
  fi
  skipped+=("$1")
  echo "== $1: skipped, ${SECONDS}s gone (GPU_CHECK_BUDGET_S=$budget)"
  return 1
}

# The last LINES lines of each FILE, to show what went wrong; never fails
# the script (set -e) where a log is missing. `tail -5 a b` is no help:
# GNU tail refuses the short form with more than one file.
show_log() {
  local lines=$1 f
  shift
  for f in "$@"; do
    if [[ -f $f ]]; then
      (($# > 1)) && echo "-- $f"
      tail -n "$lines" "$f" || true
    fi
  done
  return 0
}

# Runs tests/integration/scripts/SCRIPT ARGS... on CUDA under nanhunt into
# the folder RUN, with RUN.log its output and RUN.json `nanhunt view --json`.
on_cuda() {
  local run=$1 script=$2
  shift 2
  rm -rf "$run"
  DEVICE=cuda "$build"/bin/nanhunt run --out "$run" -- "$python" \
    "tests/integration/scripts/$script" "$@" > "$run.log" 2>&1 || true
  "$build"/bin/nanhunt view --json "$run" > "$run.json" || true
}

if [[ $without_gpu != 1 ]]; then
  "$python" -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
fi
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DNANHUNT_PYTHON="$python" \
  ${prefix:+-DCMAKE_PREFIX_PATH=$prefix/usr -DCMAKE_INCLUDE_PATH=$prefix/usr/include -DCMAKE_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu} \
  -DCMAKE_CUDA_ARCHITECTURES="$cuda_architectures" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep '^-- nanhunt' "$build.configure.log" || true
if [[ -n $bench_modes ]]; then
  cmake --build "$build" -j"$(nproc)" --target nanhunt nanhunt_cli nanhunt_torch nanhunt_cuda empty_op_callbacks \
    "${keep_going[@]}" | { grep -v '^\[' || true; }
  "$python" bench/gpt2_bench.py --build "$build" --modes "$bench_modes" --rounds "${bench_rounds:-3}"
  exit
fi
cmake --build "$build" -j"$(nproc)" --target nanhunt_gpu_tests gpu_check_bandwidth nanhunt_unit_tests \
  nanhunt_cuda_api_test nanhunt_kernel_names_test mutex_cost ring_cost "${keep_going[@]}"

part "GPU tests"
"$build"/bin/nanhunt_gpu_tests --gtest_brief=1 || failed+=("GPU tests")
part "the GPU library as the plugin loads it (enqueue, deliver), CUPTI names"
"$build"/bin/nanhunt_cuda_api_test --gtest_brief=1 || failed+=("GPU library tests")
"$build"/bin/nanhunt_kernel_names_test --gtest_brief=1 || failed+=("CUPTI tests")
part "unit tests (CPU)"
"$build"/bin/nanhunt_unit_tests --gtest_brief=1 || failed+=("unit tests")
part "check kernel benchmark"
"$build"/bin/gpu_check_bandwidth | tee "$build"/bandwidth.txt || failed+=("kernel benchmark")
part "what a lock costs in this machine's abseil (nanhunt's plugin turns deadlock detection off)"
"$build"/bin/mutex_cost | tee "$build"/mutex-cost.txt || failed+=("mutex cost")
part "the check ring's share of an enqueue's host time (this machine's CPU, no CUDA calls)"
"$build"/bin/ring_cost | tee "$build"/ring-cost.txt || failed+=("ring cost")

part "torch_compat.h's fallbacks for older torch (overload names; stream handles against torch's own)"
if cmake --build "$build" -j"$(nproc)" --target torch_compat_probe "${keep_going[@]}" >"$build"/probe-build.log; then
  "$build"/tests/torch_compat_probe | tee "$build"/probe.log || failed+=("torch_compat fallbacks")
  grep "^stream handles" "$build"/probe.log > "$build"/probe-check.txt || echo "stream handles: not compared" > "$build"/probe-check.txt
else
  { grep -v '^\[' "$build"/probe-build.log | tail -n 20 || true; }; failed+=("torch_compat probe build")
fi

part "the demo on CUDA, fp16 autocast, under nanhunt"
if ! cmake --build "$build" -j"$(nproc)" --target nanhunt nanhunt_cli nanhunt_torch nanhunt_cuda \
    "${keep_going[@]}" >"$build"/plugin-build.log; then
  grep -v '^\[' "$build"/plugin-build.log
  echo "FAILED: the build of the library and the torch plugin"
  exit 1
fi
rm -rf "$build"/demo-cuda
"$build"/bin/nanhunt run --out "$build"/demo-cuda -- "$python" demo/train.py --device cuda \
  > "$build"/demo-cuda.log 2>&1 || true
show_log 25 "$build"/demo-cuda.log
"$build"/bin/nanhunt view --json "$build"/demo-cuda > "$build"/demo-cuda.json || true
("$python" - "$build"/demo-cuda.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
o = r["first_origin"] or {}
# Kernel names too: NANHUNT_KERNEL_NAMES=auto subscribes at the first
# warning, and the demo warns well before it overflows.
ok = o.get("op") == "aten::bmm" and o.get("phase") == "forward" and bool(o.get("kernels"))
print(f"demo on CUDA: first origin {o.get('op')} ({o.get('phase')}) step {o.get('step')} "
      f"source {o.get('source') or '-'} kernels {o.get('kernels') or '-'}: "
      f"{'OK' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
) | tee "$build"/demo-cuda-check.txt || failed+=("demo on CUDA")

part "GPT-2-small-sized training, fp16 autocast: plain / torch's callbacks / nanhunt / sample / anomaly"
# Its empty-callbacks mode's library; without it that row says it failed.
cmake --build "$build" --target empty_op_callbacks >"$build"/empty-callbacks-build.log 2>&1 \
  || { show_log 20 "$build"/empty-callbacks-build.log; failed+=("empty callbacks' build"); }
"$python" bench/gpt2_bench.py --build "$build" --rounds 2 | tee "$build"/gpt2.txt || failed+=("GPT-2 benchmark")

# The parts below run while time is left (GPU_CHECK_BUDGET_S): the issue's own
# first (streams, graph capture, batches), then the scenarios.
if time_left "streams and devices"; then
part "side streams and a second GPU (when there is one), under nanhunt"
rm -rf "$build"/streams
"$build"/bin/nanhunt run --out "$build"/streams -- "$python" tests/gpu/streams_and_devices.py \
  > "$build"/streams.log 2>&1 || true
"$build"/bin/nanhunt view --json "$build"/streams > "$build"/streams.json || true
("$python" - "$build"/streams.json "$build"/streams.log <<'PY'
import json, sys
log = open(sys.argv[2]).read()
try:
    o = json.load(open(sys.argv[1]))["first_origin"] or {}
except Exception as e:
    o = {"error": repr(e)}
devices = next((l.split()[1] for l in log.splitlines() if l.startswith("devices ")), "?")
ok = o.get("op") in ("aten::mm", "aten::matmul") and o.get("step") == 2 and "NOT checked" not in log
print(f"streams, {devices} GPU(s): first origin {o.get('op')} step {o.get('step')}: "
      f"{'OK' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
) | tee "$build"/streams-check.txt || { failed+=("$part_name"); show_log 20 "$build"/streams.log; }
fi

if time_left "CUDA graph capture"; then
part "a whole step captured into a CUDA graph (global mode) while a check is in flight"
rm -rf "$build"/graph
"$python" tests/gpu/graph_capture.py > "$build"/graph-plain.log 2>&1 || true
NANHUNT_MODE=sample NANHUNT_SAMPLE_OPS=1 NANHUNT_SKIP_NONFINITE_STEPS=1 \
  "$build"/bin/nanhunt run --out "$build"/graph -- \
  "$python" tests/gpu/graph_capture.py > "$build"/graph.log 2>&1 || true
"$build"/bin/nanhunt view --json "$build"/graph > "$build"/graph.json || true
("$python" - "$build"/graph-plain.log "$build"/graph.log "$build"/graph.json <<'PY'
import json, sys
plain, monitored = (next((l for l in open(p) if l.startswith("replayed ")), "none")
                    for p in sys.argv[1:3])
try:
    view = json.load(open(sys.argv[3]))
    notes, unchecked = " ".join(view["problems"]), view["unchecked_ops"]
except Exception as e:
    notes, unchecked = repr(e), []
# The trace names the captured ops (the model's addmm among them), not only a count.
captured = [(u["op"], u["phase"]) for u in unchecked if u["reason"] == "graph_capture"]
print("captured, unchecked:", captured[:6], "..." if len(captured) > 6 else "")
ok = (plain != "none" and plain == monitored and "captured into CUDA graphs" in notes
      and "inside a CUDA graph capture" in notes and ("aten::addmm", "forward") in captured
      and len(captured) >= 3)
print(f"CUDA graph capture: {'replays identical to unmonitored, captured ops named' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
) | tee "$build"/graph-check.txt || { failed+=("$part_name"); show_log 20 "$build"/graph.log; }
fi

if time_left "held-back checks"; then
part "checks held back for batches (NANHUNT_GPU_BATCH=32): demo, and writes after the op"
for scenario in demo same-stream other-stream released unrelated-writes; do
  rm -rf "$build/batch-$scenario"
  if [[ $scenario == demo ]]; then cmd=(demo/train.py --device cuda)
  else cmd=(tests/gpu/batched_checks.py "$scenario"); fi
  NANHUNT_GPU_BATCH=32 "$build"/bin/nanhunt run --out "$build/batch-$scenario" -- "$python" "${cmd[@]}" \
    > "$build/batch-$scenario.log" 2>&1 || true
  "$build"/bin/nanhunt view --json "$build/batch-$scenario" > "$build/batch-$scenario.json" || true
done
rm -rf "$build/batch-auto"
cmake --build "$build" --target foreign_probe_cudart >/dev/null 2>&1 || true
NANHUNT_GPU_BATCH=auto "$build"/bin/nanhunt run --out "$build/batch-auto" -- "$python" \
  tests/gpu/batch_auto.py "$build/tests/foreign/libforeign_probe_cudart.so" > "$build/batch-auto.log" 2>&1 || true
("$python" - "$build" <<'PY'
import json, sqlite3, sys
from pathlib import Path
build = Path(sys.argv[1])
def origin(name):
    try:
        return json.load(open(build / f"{name}.json"))["first_origin"] or {}
    except Exception as e:
        return {"error": repr(e)}
def meta(name):
    trace = sorted((build / name).glob("*.sqlite"))
    return dict(sqlite3.connect(trace[-1]).execute("SELECT key, value FROM meta")) if trace else {}
ok = True
# The demo: the same first origin as checked op by op, every output
# checked (as many checks as unbatched), in fewer launches.
plain, held = origin("demo-cuda"), origin("batch-demo")
m, m1 = meta("batch-demo"), meta("demo-cuda")
same = all(plain.get(k) == held.get(k) for k in ("op", "phase", "step")) and plain.get("op")
batches = int(m.get("device_check_batches", 0))
checks, checks1 = int(m.get("device_checks", 0)), int(m1.get("device_checks", -1))
print(f"batched demo: first origin {held.get('op')} step {held.get('step')} (op by op: "
      f"{plain.get('op')} step {plain.get('step')}), {checks} checks in {batches} batches "
      f"(op by op: {checks1}): {'OK' if same and batches > 0 and checks == checks1 else 'WRONG'}")
ok &= bool(same) and batches > 0 and checks == checks1
for scenario in ("same-stream", "other-stream"):
    o = origin(f"batch-{scenario}")
    good = o.get("op") == "aten::mul_" and int(meta(f"batch-{scenario}").get("device_check_batches", 0)) > 0
    print(f"batched, write after the op ({scenario}): first origin {o.get('op')}: "
          f"{'OK' if good else 'WRONG (the held check saw the later write)'}")
    ok &= good
m = meta("batch-released")
o = origin("batch-released")
try:
    dropped = [u["op"] for u in json.load(open(build / "batch-released.json"))["unchecked_ops"]
               if u["reason"] == "released_before_check"]
except Exception as e:
    dropped = [repr(e)]
good = (o.get("op") == "aten::exp" and int(m.get("outputs_released_before_check", 0)) >= 1
        and dropped == ["aten::mul"])
print(f"batched, memory released before the check: first origin {o.get('op')}, "
      f"{m.get('outputs_released_before_check', 0)} dropped ({', '.join(dropped) or 'no op named'}): "
      f"{'OK' if good else 'WRONG (a check read memory its storage gave back, or the op is not named)'}")
ok &= good
m = meta("batch-unrelated-writes")
per_batch = int(m.get("device_checks", 0)) / max(1, int(m.get("device_check_batches", 0)))
print(f"batched, writes to memory nothing held reads: {per_batch:.1f} checks a batch: "
      f"{'OK' if per_batch >= 16 else 'WRONG (flushed at writes that change no held check)'}")
ok &= per_batch >= 16
# auto: batches until the probe (linked against the CUDA runtime) loads.
m = meta("batch-auto")
stopped = m.get("gpu_batch_stopped", "")
good = (int(m.get("device_check_batches", 0)) > 0 and "libforeign_probe_cudart" in stopped
        and int(m.get("device_checks", 0)) >= 400)
print(f"NANHUNT_GPU_BATCH=auto: {m.get('device_checks')} checks, {m.get('device_check_batches')} "
      f"batches, stopped: {stopped or '-'}: {'OK' if good else 'WRONG'}")
ok &= good
sys.exit(0 if ok else 1)
PY
) | tee "$build"/batch-check.txt || { failed+=("$part_name"); show_log 5 "$build"/batch-*.log; }
fi

if time_left "batch replay"; then
part "held-back batches replayed over a GPT-2-small step's CUDA ops (a model of the policy)"
"$python" bench/batch_replay.py --device cuda --steps 1 2>/dev/null | grep -v "^step_ms" | tee "$build"/batch-replay.txt \
  || failed+=("$part_name")
fi

if time_left "raise on CUDA"; then
part "the demo on CUDA with NANHUNT_ON_NONFINITE=raise: NonFiniteError from a late verdict"
NANHUNT_ON_NONFINITE=raise "$build"/bin/nanhunt run --out "$build"/demo-raise -- "$python" demo/train.py \
  --device cuda > "$build"/demo-raise.log 2>&1 || true
if grep -q "NonFiniteError" "$build"/demo-raise.log && grep -q "nanhunt: raising NonFiniteError" "$build"/demo-raise.log \
    && ! grep -q "aborting" "$build"/demo-raise.log; then
  echo "raise on CUDA: NonFiniteError raised in the training script: OK" | tee "$build"/raise-check.txt
else
  echo "raise on CUDA: WRONG" | tee "$build"/raise-check.txt; show_log 15 "$build"/demo-raise.log; failed+=("$part_name")
fi
fi

if time_left "finfo.min masks on CUDA"; then
part "Hugging Face's torch.finfo(dtype).min masks on CUDA: healthy; beside them, a real overflow"
for overflow in -1 2; do
  OVERFLOW=$overflow on_cuda "$build/finfo-$overflow" finfo_min_masks.py
done
("$python" - "$build" <<'PY'
import json, sys
def load(name):
    try:
        return json.load(open(f"{sys.argv[1]}/{name}.json"))
    except Exception as e:
        return {"error": repr(e)}
healthy, bad = load("finfo--1"), load("finfo-2")
warned = "warning:" in open(f"{sys.argv[1]}/finfo--1.log").read()
o = bad.get("first_origin") or {}
ok = (healthy.get("first_origin", 1) is None and not healthy.get("warnings", 1) and not warned
      and o.get("op") == "aten::bmm" and o.get("step") == 2)
print(f"finfo.min masks on CUDA: healthy run origin {healthy.get('first_origin', '?')}, "
      f"warned {warned}; overflow run origin {o.get('op')} step {o.get('step')}: "
      f"{'OK' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
) | tee "$build"/finfo-check.txt || { failed+=("$part_name"); show_log 20 "$build/finfo--1.log"; }
fi

if time_left "Adam foreach on CUDA"; then
part "Adam's foreach update on fp16 weights on CUDA: checked as it writes, its fp16 state named"
on_cuda "$build"/adam-fp16 adam_on_fp16_weights.py foreach
("$python" - "$build"/adam-fp16.json <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    r = {"error": repr(e)}
o, d = r.get("first_origin") or {}, r.get("diagnosis") or {}
ok = (o.get("op") == "aten::_foreach_addcdiv_" and o.get("phase") == "optimizer"
      and d.get("kind") == "fp16_optimizer_state")
print(f"Adam foreach on fp16 weights, CUDA: first origin {o.get('op')} ({o.get('phase')}) "
      f"step {o.get('step')}, diagnosis {d.get('kind')}: {'OK' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
) | tee "$build"/adam-fp16-check.txt || { failed+=("$part_name"); show_log 20 "$build"/adam-fp16.log; }
fi

if time_left "own loss scaler on CUDA"; then
part "a loss scaler of the program's own on CUDA: its skips followed, the run healthy"
for mode in set-to-none in-place accumulate; do  # side by side: mostly torch's start-up
  on_cuda "$build/own-scaler-$mode" own_loss_scaler.py "$mode" &
done
wait
("$python" - "$build" <<'PY'
import json, sys
bad = 0
for mode in ("set-to-none", "in-place", "accumulate"):
    base = f"{sys.argv[1]}/own-scaler-{mode}"
    skipped = [int(l.split()[0]) for l in open(base + ".log") if " skip " in l]
    try:
        r = json.load(open(base + ".json"))
    except Exception as e:
        r = {"error": repr(e)}
    d = r.get("diagnosis") or {}
    ok = (bool(skipped) and r.get("program_skipped_steps") == skipped and r.get("steps") == 30
          and d.get("kind") == "healthy")
    bad += not ok
    print(f"own loss scaler, {mode}, CUDA: the program skipped {len(skipped)}, nanhunt followed "
          f"{len(r.get('program_skipped_steps') or [])} of 30 steps {r.get('steps')}, "
          f"diagnosis {d.get('kind')}: {'OK' if ok else 'WRONG'}")
sys.exit(1 if bad else 0)
PY
) | tee "$build"/own-scaler-check.txt || { failed+=("$part_name"); show_log 20 "$build"/own-scaler-set-to-none.log; }
fi

if time_left "several optimizers on CUDA"; then
part "several optimizer steps an iteration on CUDA: one step each, the overflow in its iteration (also in sample mode)"
for layout in two-optimizers in-backward gan gan-gradscaler; do
  for phase in forward backward; do
    on_cuda "$build/several-$layout-$phase" several_optimizers.py "$layout" "$phase" &
  done
done
for layout in two-optimizers in-backward gradscaler gan; do
  NANHUNT_MODE=sample NANHUNT_SAMPLE_STEPS=0 \
    on_cuda "$build/several-sample-$layout" several_optimizers.py "$layout" forward &
done
wait
("$python" - "$build" <<'PY'
import glob, json, sqlite3, sys
bad = 0
# A GAN's generator joins its discriminator's step once its optimizer
# steps: its results, delivered late, are renumbered on arrival.
for layout in ("two-optimizers", "in-backward", "gan", "gan-gradscaler"):
    for phase in ("forward", "backward"):
        base = f"{sys.argv[1]}/several-{layout}-{phase}"
        try:
            r = json.load(open(base + ".json"))
            [trace] = glob.glob(base + "/*.sqlite")
            ops = sqlite3.connect(trace).execute(
                "SELECT step, SUM(ops) FROM steps GROUP BY step ORDER BY step").fetchall()
        except Exception as e:
            r, ops = {"error": repr(e)}, []
        o = r.get("first_origin") or {}
        # GradScaler's skips (the generator's alone in backward) leave a
        # step with fewer ops: its skip, reported without a record, must
        # still end the update in its iteration's step.
        same_ops = (r.get("skipped_steps") == [2] if layout == "gan-gradscaler"
                    else len({n for _, n in ops}) == 1)
        ok = ((o.get("phase"), o.get("step")) == (phase, 2) and r.get("steps") == 4
              and [s for s, _ in ops] == [0, 1, 2, 3] and same_ops)
        bad += not ok
        print(f"{layout}, overflow in {phase}, CUDA: first origin {o.get('op')} ({o.get('phase')}) "
              f"step {o.get('step')}, {r.get('steps')} steps, ops a step "
              f"{sorted({n for _, n in ops})}: {'OK' if ok else 'WRONG'}")
# Sample mode sees no forward pass: the optimizers the step guard names
# keep one step an iteration (8 steps before, and the overflow at 4).
for layout in ("two-optimizers", "in-backward", "gradscaler", "gan"):
    try:
        r = json.load(open(f"{sys.argv[1]}/several-sample-{layout}.json"))
    except Exception as e:
        r = {"error": repr(e)}
    o = r.get("first_origin") or {}
    ok = r.get("steps") == 4 and o.get("step") == 2
    bad += not ok
    print(f"{layout}, sample mode, CUDA: first seen {o.get('op')} ({o.get('kind')}) step "
          f"{o.get('step')}, {r.get('steps')} steps: {'OK' if ok else 'WRONG'}")
sys.exit(1 if bad else 0)
PY
) | tee "$build"/several-check.txt || { failed+=("$part_name"); show_log 20 "$build"/several-in-backward-backward.log; }
fi

if time_left "padded attention on CUDA"; then
part "a softmax's NaN over padding, zeroed each step, on CUDA: dropped, healthy; kept: the softmax's own"
for mode in dropped kept; do
  on_cuda "$build/padded-$mode" padded_attention_by_hand.py "$mode" &
done
wait
("$python" - "$build" <<'PY'
import json, sys
bad = 0
for mode, kind in (("dropped", "healthy"), ("kept", "invalid_math")):
    try:
        r = json.load(open(f"{sys.argv[1]}/padded-{mode}.json"))
    except Exception as e:
        r = {"error": repr(e)}
    o, d = r.get("first_origin") or {}, r.get("diagnosis") or {}
    ok = (o.get("op"), o.get("step"), d.get("kind")) == ("aten::_softmax", 0, kind)
    bad += not ok
    print(f"padded attention, {mode}, CUDA: first origin {o.get('op')} step {o.get('step')}, "
          f"diagnosis {d.get('kind')}: {'OK' if ok else 'WRONG'}")
sys.exit(1 if bad else 0)
PY
) | tee "$build"/padded-check.txt || { failed+=("$part_name"); show_log 20 "$build"/padded-dropped.log; }
fi

if time_left "workspaces on CUDA"; then
part "outputs that are workspaces on CUDA: CTC's log_alpha, efficient attention's +inf-padded log-sum-exp: healthy"
on_cuda "$build"/ctc-healthy ctc_training.py healthy &
on_cuda "$build"/ctc-impossible ctc_training.py impossible &
on_cuda "$build"/padded-sdpa padded_sdpa_training.py &
wait
("$python" - "$build" <<'PY'
import json, sys
views = {}
for name in ("ctc-healthy", "padded-sdpa", "ctc-impossible"):
    try:
        views[name] = json.load(open(f"{sys.argv[1]}/{name}.json"))
    except Exception as e:  # a run that never wrote its trace
        views[name] = {"error": repr(e)}
bad = 0
for name in ("ctc-healthy", "padded-sdpa"):
    o = views[name].get("first_origin", "?")
    ok = o is None
    bad += not ok
    print(f"{name}, CUDA: first origin {(o or {}).get('op') if o != '?' else '?'}: "
          f"{'OK' if ok else 'WRONG (a workspace judged as values)'}")
o = views["ctc-impossible"].get("first_origin") or {}
ok = (o.get("op"), o.get("step"), o.get("posinf")) == ("aten::_ctc_loss", 3, 1) and \
    "target_lengths=[5, 4, 3, 8]" in (o.get("inputs") or "")
bad += not ok
print(f"ctc-impossible, CUDA: first origin {o.get('op')} step {o.get('step')} +inf={o.get('posinf')} "
      f"{o.get('inputs')}: {'OK' if ok else 'WRONG'}")
sys.exit(1 if bad else 0)
PY
) | tee "$build"/workspace-check.txt || { failed+=("$part_name"); show_log 20 "$build"/padded-sdpa.log; }
fi

if time_left "evaluation on CUDA"; then
part "an evaluation on CUDA, training nothing: each forward pass a step, the overflow at batch 5 of 8"
on_cuda "$build"/evaluation evaluation_only.py no_grad
("$python" - "$build"/evaluation.json <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    r = {"error": repr(e)}
o = r.get("first_origin") or {}
ok = (o.get("step"), r.get("steps"), r.get("forward_passes")) == (5, 8, True)
print(f"evaluation, CUDA: first origin {o.get('op')} step {o.get('step')}, {r.get('steps')} "
      f"steps, forward passes: {r.get('forward_passes')}: {'OK' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
) | tee "$build"/evaluation-check.txt || { failed+=("$part_name"); show_log 20 "$build"/evaluation.log; }
fi

if time_left "given-up iterations on CUDA"; then
part "iterations given up on a non-finite loss, on CUDA (also under a GradScaler, and before the first backward pass): a step each; two views, an RNN cell: one step"
for mode in continue gradscaler two-views rnn; do
  on_cuda "$build/given-up-$mode" skip_nonfinite_loss.py "$mode" &
done
for mode in continue two-views; do  # batches 0 and 1 overflow, before the process trains
  on_cuda "$build/given-up-$mode-first" skip_nonfinite_loss.py "$mode" first &
done
wait
("$python" - "$build" <<'PY'
import json, sys
bad = 0
for mode, nonfinite, given_up in (("continue", [3, 4], [3, 4]),
                                  ("gradscaler", None, [3, 4]),
                                  ("two-views", list(range(3, 10)), []),
                                  ("rnn", list(range(3, 10)), []),
                                  ("continue-first", [0, 1], [0, 1]),
                                  ("two-views-first", list(range(10)), [])):
    try:
        r = json.load(open(f"{sys.argv[1]}/given-up-{mode}.json"))
    except Exception as e:
        r = {"error": repr(e)}
    o, d = r.get("first_origin") or {}, r.get("diagnosis") or {}
    if nonfinite is None:  # the scaler's settling comes first; the diagnosis names step 3
        ok = ((r.get("steps"), r.get("given_up_steps"), d.get("kind")) ==
              (10, given_up, "forward_overflow") and "at step 3" in d.get("title", ""))
    else:
        ok = ((o.get("step"), o.get("phase"), r.get("steps"), r.get("nonfinite_steps"),
               r.get("given_up_steps")) == (nonfinite[0], "forward", 10, nonfinite, given_up))
    bad += not ok
    print(f"given up, {mode}, CUDA: first origin {o.get('op')} step {o.get('step')}, "
          f"{r.get('steps')} steps, given up {r.get('given_up_steps')}: {'OK' if ok else 'WRONG'}")
sys.exit(1 if bad else 0)
PY
) | tee "$build"/given-up-check.txt || { failed+=("$part_name"); show_log 20 "$build"/given-up-continue.log; }
fi

if time_left "divergence on CUDA"; then
part "a learning rate too high, on CUDA: the update's values are GPU results that come after their step; warned live at step 3, before any inf (diverging), and diverged once the loss is inf"
on_cuda "$build"/diverging diverging_learning_rate.py diverging 5 &
on_cuda "$build"/diverged diverging_learning_rate.py diverging &
wait
("$python" - "$build" <<'PY'
import json, sys
bad = 0
for name, kind in (("diverging", "diverging"), ("diverged", "diverged")):
    try:
        r = json.load(open(f"{sys.argv[1]}/{name}.json"))
    except Exception as e:
        r = {"error": repr(e)}
    d = r.get("diagnosis") or {}
    evidence = " ".join(d.get("evidence") or [])
    warned = "warning: the training is diverging" in open(f"{sys.argv[1]}/{name}.log").read()
    ok = d.get("kind") == kind and warned and "at step 3" in evidence
    bad += not ok
    print(f"{name}, CUDA: diagnosis {d.get('kind')}, warned live {warned}: "
          f"{'OK' if ok else 'WRONG'} ({d.get('title')})")
sys.exit(1 if bad else 0)
PY
) | tee "$build"/divergence-check.txt || { failed+=("$part_name"); show_log 20 "$build"/diverging.log; }
fi

if time_left "forward lines on CUDA"; then
part "a backward overflow that never recurs, on CUDA: the first origin's forward op line comes from the same call a step later, though its result is read after its step"
on_cuda "$build"/backward-once backward_overflow_once.py
("$python" - "$build" <<'PY'
import json, sys
try:
    first = json.load(open(f"{sys.argv[1]}/backward-once.json")).get("first_origin") or {}
except Exception as e:
    first = {"error": repr(e)}
ok = (first.get("op"), first.get("phase"), first.get("step")) == ("aten::div", "backward", 3) \
    and first.get("source", "").endswith("backward_overflow_once.py:29 in <module>")
print(f"first origin {first.get('op')} ({first.get('phase')}) at step {first.get('step')}, "
      f"forward op called at {first.get('source') or '(no line)'}: {'OK' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
) | tee "$build"/forward-lines-check.txt || { failed+=("$part_name"); show_log 20 "$build"/backward-once.log; }
fi

if time_left "own masked divisions on CUDA"; then
part "formulas that mask their own division by 0 or log(0), on CUDA: F.normalize of padding embeddings, a SincNet filter bank's sinc at 0, a phase loss's angle over silence, NeRF's cumprod through an opaque sample, GeM's learned exponent over a ReLU's zeros, Poisson's Stirling term at zero counts, a Cox likelihood's logcumsumexp; no origin (their inputs are not read there)"
own_masked=(normalized_padding.py sinc_filterbank.py "phase_loss_on_silence.py angle" nerf_transmittance.py
  "gem_pooling.py relu" "poisson_counts.py log-rate" cox_survival.py)
for i in "${!own_masked[@]}"; do
  # shellcheck disable=SC2086  # a script and its argument
  on_cuda "$build"/own-masked-$i ${own_masked[$i]}
done
("$python" - "$build" "${own_masked[@]}" <<'PY'
import json, sys
ok = True
for i, script in enumerate(sys.argv[2:]):
    try:
        r = json.load(open(f"{sys.argv[1]}/own-masked-{i}.json"))
    except Exception as e:
        r = {"error": repr(e)}
    d = r.get("diagnosis") or {}
    # Its three steps ran (without a GPU a script stops at its first tensor).
    good = r.get("steps") == 3 and r.get("first_origin") is None and \
        (d.get("title") or "").startswith("Healthy: no non-finite")
    ok &= good
    print(f"{script}, CUDA: {r.get('steps')} steps, {d.get('title')}, first origin "
          f"{r.get('first_origin')}: {'OK' if good else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
) | tee "$build"/own-masked-check.txt || { failed+=("$part_name"); show_log 10 "$build"/own-masked-*.log; }
fi

if time_left "NaN markers on CUDA"; then
part "NaN the program places as markers of absent classes, skipped by torch.nanmean, on CUDA: healthy, no step non-finite; x.mean() over them is nan_marker_reached"
on_cuda "$build"/nan-markers nan_marked_classes.py scalar nanmean
on_cuda "$build"/nan-markers-mean nan_marked_classes.py scalar mean
("$python" - "$build" <<'PY'
import json, sys
views = []
for name in ("nan-markers", "nan-markers-mean"):
    try:
        views.append(json.load(open(f"{sys.argv[1]}/{name}.json")))
    except Exception as e:
        views.append({"error": repr(e)})
skipped, mean = views
title = (skipped.get("diagnosis") or {}).get("title") or ""
kind = (mean.get("diagnosis") or {}).get("kind")
good_skipped = skipped.get("steps") == 3 and skipped.get("nonfinite_steps") == [] and \
    title.startswith("Healthy: no non-finite")
good_mean = mean.get("steps") == 3 and kind == "nan_marker_reached"
print(f"nanmean, CUDA: {skipped.get('steps')} steps, non-finite steps "
      f"{skipped.get('nonfinite_steps')}, {title}: {'OK' if good_skipped else 'WRONG'}")
print(f"mean, CUDA: {mean.get('steps')} steps, {kind}: {'OK' if good_mean else 'WRONG'}")
sys.exit(0 if good_skipped and good_mean else 1)
PY
) | tee "$build"/nan-markers-check.txt || { failed+=("$part_name"); show_log 10 "$build"/nan-markers*.log; }
fi

if time_left "fp16 FFT on CUDA"; then
part "an FNO's fp16 FFT on CUDA: its complex32 spectrum overflows at step 2, checked as real and imaginary parts"
on_cuda "$build"/spectral fp16_spectral_conv.py
("$python" - "$build"/spectral.json <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    r = {"error": repr(e)}
o = r.get("first_origin") or {}
ok = (o.get("op"), o.get("step"), o.get("dtype")) == ("aten::_fft_r2c", 2, "float16") and \
    "(complex32: " in (o.get("outputs") or "") and r.get("unchecked_ops") == []
print(f"fp16 FFT, CUDA: first origin {o.get('op')} step {o.get('step')} {o.get('dtype')} "
      f"{o.get('outputs')}, unchecked {r.get('unchecked_ops')}: {'OK' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
) | tee "$build"/spectral-check.txt || { failed+=("$part_name"); show_log 20 "$build"/spectral.log; }
fi

if time_left "fp16 batch norm on CUDA"; then
part "model.half()'s batch norm on raw features, on CUDA: its running_var overflows at step 0 in place, unreturned"
on_cuda "$build"/batch-norm batchnorm_on_raw_features.py
("$python" - "$build"/batch-norm.json <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    r = {"error": repr(e)}
o, d = r.get("first_origin") or {}, r.get("diagnosis") or {}
ok = (o.get("step"), o.get("phase"), d.get("kind")) == (0, "forward", "fp16_running_statistics") \
    and "(running_var, updated in place) max|x|=inf" in (o.get("outputs") or "")
print(f"fp16 batch norm, CUDA: first origin {o.get('op')} step {o.get('step')} "
      f"{o.get('outputs')}, diagnosis {d.get('kind')}: {'OK' if ok else 'WRONG'}")
sys.exit(0 if ok else 1)
PY
) | tee "$build"/batch-norm-check.txt || { failed+=("$part_name"); show_log 20 "$build"/batch-norm.log; }
fi

if time_left "checkpoint loaded onto CUDA"; then
part "resumed from a checkpoint loaded straight onto CUDA, with a NaN weight (copied, or assigned) or an inf in Adam's state: an input of the model or the optimizer, not the data, nor the copy's, the forward pass's or the update's origin"
for planted in nan-weight inf-adam; do
  DEVICE=cuda "$python" tests/integration/scripts/resume_from_diverged_checkpoint.py save-$planted \
    "$build"/diverged-$planted.pt > "$build"/checkpoint-save-$planted.log 2>&1 || true
  on_cuda "$build"/checkpoint-$planted resume_from_diverged_checkpoint.py resume "$build"/diverged-$planted.pt
done
on_cuda "$build"/checkpoint-assigned resume_from_diverged_checkpoint.py resume "$build"/diverged-nan-weight.pt assign
("$python" - "$build"/checkpoint-nan-weight.json "$build"/checkpoint-inf-adam.json "$build"/checkpoint-assigned.json <<'PY'
import json, sys
titles = ["The model's parameters were loaded with NaN; the data is not to blame",
          "The optimizer's state brought inf, not the data",
          "The model's parameters brought NaN, not the data"]
named = ["(copied into parameter 2.weight)", "(Adam state exp_avg_sq of 2.weight)",
         "(parameter 2.weight)"]
failed = 0
for path, title, name in zip(sys.argv[1:], titles, named):
    try:
        r = json.load(open(path))
    except Exception as e:
        r = {"error": repr(e)}
    o, d = r.get("first_origin") or {}, r.get("diagnosis") or {}
    ok = (o.get("kind"), d.get("title")) == ("input", title) and name in (o.get("inputs") or "")
    failed += not ok
    print(f"checkpoint onto CUDA: first {o.get('kind')} {o.get('op')} step {o.get('step')} "
          f"{o.get('inputs')}, diagnosis {d.get('title')}: {'OK' if ok else 'WRONG'}")
sys.exit(1 if failed else 0)
PY
) | tee "$build"/checkpoint-check.txt || { failed+=("$part_name"); show_log 20 "$build"/checkpoint-save-*.log "$build"/checkpoint-*.log; }
fi

if time_left "memory no op wrote"; then
part "GPU memory no op wrote (cudaMemset into torch.empty's, as an extension's kernel; a torch.compile region's output), read by a matmul: its input, not its origin"
for what in extension compiled; do
  rm -rf "$build"/unwritten-$what
  "$build"/bin/nanhunt run --out "$build"/unwritten-$what -- "$python" tests/gpu/unwritten_memory.py $what \
    > "$build"/unwritten-$what.log 2>&1 || true
  "$build"/bin/nanhunt view --json "$build"/unwritten-$what > "$build"/unwritten-$what.json || true
done
("$python" - "$build"/unwritten-extension.json "$build"/unwritten-compiled.json <<'PY'
import json, sys
failed = 0
for path, kind in zip(sys.argv[1:], ["input", "compiled"]):
    try:
        o = json.load(open(path)).get("first_origin") or {}
    except Exception as e:
        o = {"error": repr(e)}
    ok = (o.get("kind"), o.get("op")) == (kind, "aten::mm")
    failed += not ok
    print(f"memory no op wrote ({kind}): first {o.get('kind')} {o.get('op')} "
          f"{o.get('inputs')} {o.get('compiled_region') or ''}: {'OK' if ok else 'WRONG'}")
sys.exit(1 if failed else 0)
PY
) | tee "$build"/unwritten-check.txt || { failed+=("$part_name"); show_log 20 "$build"/unwritten-*.log; }
fi

if time_left "torch code behind the line on CUDA"; then
part "NaN made inside torch's own code, on CUDA, named with the fix for the program's call of it: Normal.log_prob of a ReLU's zero scale, nn.MultiheadAttention given an attention_mask as its key_padding_mask, layer and RMS norms with eps=0 over a padding row, F.cosine_similarity's eps of 1e-8 in model.half() (a device scalar_tensor, never read back); a GPU origin's line is read at its op's later calls, with the code it was inside"
behind=("gaussian_likelihood.py relu" "attention_padding_mask.py as-is"
  "normalization_eps_zero.py layer" "normalization_eps_zero.py rms" "normalized_padding.py half-cosine")
for i in "${!behind[@]}"; do
  # shellcheck disable=SC2086  # a script and its argument
  on_cuda "$build"/behind-$i ${behind[$i]} &
done
wait
("$python" - "$build" "${behind[@]}" <<'PY'
import json, sys
fixes = ["keep the distribution's parameters inside their support",
         "give nn.MultiheadAttention a key_padding_mask that is True at the padding only",
         "give the norm an eps > 0", "give the norm an eps > 0",
         "give F.cosine_similarity an eps float16 holds"]
failed = 0
for i, (script, fix) in enumerate(zip(sys.argv[2:], fixes)):
    try:
        r = json.load(open(f"{sys.argv[1]}/behind-{i}.json"))
    except Exception as e:
        r = {"error": repr(e)}
    o, d = r.get("first_origin") or {}, r.get("diagnosis") or {}
    first_fix = (d.get("fixes") or [""])[0]
    ok = o.get("step") == 0 and d.get("kind") == "invalid_math" and first_fix.startswith(fix)
    failed += not ok
    print(f"{script}, CUDA: first origin {o.get('op')} step {o.get('step')} "
          f"at {o.get('source') or '(no line)'} inside {o.get('via') or '(none)'}, "
          f"fix {first_fix[:60]!r}: {'OK' if ok else 'WRONG'}")
sys.exit(1 if failed else 0)
PY
) | tee "$build"/behind-check.txt || { failed+=("$part_name"); show_log 20 "$build"/behind-*.log; }
fi

echo
echo "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
tail -n +2 "$build"/bandwidth.txt 2>/dev/null || echo "kernel benchmark: no figures"
grep '^ring,' "$build"/ring-cost.txt 2>/dev/null | sed 's/^/check ring (ns a check, extra, switches): /' || true
for part in probe-check demo-cuda-check raise-check finfo-check adam-fp16-check own-scaler-check several-check padded-check \
    workspace-check \
    evaluation-check given-up-check spectral-check batch-norm-check checkpoint-check unwritten-check \
    behind-check streams-check graph-check batch-check \
    batch-replay; do
  cat "$build/$part.txt" 2>/dev/null || echo "$part: no result"
done
sed -n '/ fp16 autocast, /,$p' "$build"/gpt2.txt 2>/dev/null
echo "took ${SECONDS}s"
if ((${#skipped[@]})); then
  printf 'SKIPPED (no time left): %s\n' "${skipped[@]}"
fi
if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
if ((${#skipped[@]})); then
  echo "every part that ran passed"
  exit 3
fi
echo "all parts passed"
