"""The GPU benchmark of the issue: a GPT-2-small-sized model, fp16 autocast,
plain / nanhunt checking every op / nanhunt's sample mode (1% of ops) /
set_detect_anomaly, interleaved over a few rounds, median step times (CUDA
events) and ratios to plain. Targets: every-op checking at most 1.15x plain,
sample mode at most 1.01x. Run by scripts/gpu-check.sh;
`--device cpu --tiny` checks the script itself without a GPU."""
import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def trace_meta(out):
    """Meta of the newest trace in OUT: what a monitored run really did,
    with the GradScaler updates it recorded as `loss_scale_rows`."""
    traces = sorted(Path(out).glob("*.sqlite"), key=lambda p: p.stat().st_mtime)
    if not traces:
        return {}
    db = sqlite3.connect(traces[-1])
    try:
        meta = dict(db.execute("SELECT key, value FROM meta"))
        meta["loss_scale_rows"] = db.execute("SELECT count(*) FROM loss_scale").fetchone()[0]
        return meta
    finally:
        db.close()


# Monitored modes. By default (NANHUNT_KERNEL_NAMES=auto) a healthy run
# never subscribes to CUPTI; "-names" subscribes from the first GPU op
# (NANHUNT_KERNEL_NAMES=1): what a run pays once something came near the
# limit.
# "nanhunt-batch" holds checks back and enqueues them 32 at a time while no
# code with kernels of its own is loaded (NANHUNT_GPU_BATCH=auto, the
# candidate default; core/check_batches.h).
MONITORED = ("nanhunt", "sample", "nanhunt-names", "nanhunt-batch", "sample-names")
# "empty-callbacks" observes every op as nanhunt does (inputs and outputs
# boxed) with callbacks that do nothing (bench/empty_op_callbacks.cc): the
# share of every-op checking that torch charges any observer of every op.
LABELS = [("plain", "plain"),
          ("empty-callbacks", "torch's op callbacks, empty"),
          ("nanhunt", "nanhunt (every op checked)"),
          ("nanhunt-names", "  the same, kernel names on"),
          ("nanhunt-batch", "  the same, batches (auto)"),
          ("sample", "nanhunt sample (1% of ops)"),
          ("sample-names", "  the same, kernel names on"),
          ("anomaly", "set_detect_anomaly(True)")]


def print_trace_figures(meta, steps):
    """What a monitored run did (a fast run that checked nothing would be no
    figure) and nanhunt's own host time a step (core/self_time.h)."""
    ops = float(meta.get("ops_observed", "nan")) / steps
    per_op = float(meta.get("host_us_per_op", "nan"))
    host = (f"host, a step: {ops:.0f} ops at {per_op:.2f} us in nanhunt's callbacks = "
            f"{ops * per_op / 1000:.2f} ms")
    if "device_checks" not in meta:
        print(f"{'':<4}no GPU check enqueued, unchecked outputs "
              f"{meta.get('outputs_unchecked', '?')}; {host}")
        return
    names = ("off: " + meta["kernel_names_off"] if "kernel_names_off" in meta
             else f"on, {meta.get('kernel_launches', '?')} launches seen")
    print(f"{'':<4}GPU checks {meta['device_checks']}, unchecked outputs "
          f"{meta.get('outputs_unchecked', '?')}, ring waits "
          f"{meta.get('check_ring_waits', '?')}, kernel names {names}, GradScaler "
          f"updates recorded {meta['loss_scale_rows']} of {steps}")
    print(f"{'':<4}{host}; {float(meta['device_checks']) / steps:.0f} outputs checked "
          f"({float(meta.get('device_bytes_checked', 'nan')) / steps / 1e9:.2f} GB read on the "
          "GPU: divide by the check's bandwidth above for its GPU time), "
          f"{meta.get('host_us_per_gpu_op', '?')} us of an op's callbacks for its GPU "
          f"outputs, {meta.get('host_us_per_enqueue', '?')} us an enqueue (one tensor or a batch), "
          + (f"{float(meta['device_checks']) / float(meta['device_check_batches']):.1f} "
             "checks a held-back batch, " if "device_check_batches" in meta else "") +
          (f"batching stopped: {meta['gpu_batch_stopped']}, " if "gpu_batch_stopped" in meta
           else "") +
          f"results delivered in "
          f"{float(meta.get('delivery_seconds', 'nan')) * 1000 / steps:.2f} ms")


def run(mode, args, out):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NANHUNT_") and k != "LD_PRELOAD"}
    out = os.path.join(out, mode)
    cmd = [sys.executable, str(ROOT / "bench" / "gpt2_step.py"), "--device", args.device,
           "--steps", str(args.steps)] + (["--tiny"] if args.tiny else [])
    if mode in MONITORED:
        env.update(LD_PRELOAD=str(Path(args.build) / "lib" / "libnanhunt.so"),
                   NANHUNT_OUT=out, NANHUNT_QUIET="1", NANHUNT_EXIT_SUMMARY="0")
    if mode.endswith("-names"):
        env.update(NANHUNT_KERNEL_NAMES="1")
    if mode.endswith("-batch"):
        env.update(NANHUNT_GPU_BATCH="auto")
    if mode.startswith("sample"):
        env.update(NANHUNT_MODE="sample", NANHUNT_SAMPLE_OPS="0.01",
                   NANHUNT_SAMPLE_STEPS="0")
    if mode == "anomaly":
        cmd.append("--anomaly")
    if mode == "empty-callbacks":
        cmd[1:2] = [str(ROOT / "bench" / "with_empty_op_callbacks.py"),
                    str(Path(args.build) / "lib" / "libempty_op_callbacks.so"), cmd[1]]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        # The other modes' rows still come: a GPU lease is too scarce to
        # lose them all to one mode. The exit status says it failed.
        print(f"{mode} run failed (exit {r.returncode}):\n{r.stderr[-2000:]}", file=sys.stderr)
        return None
    for line in r.stderr.splitlines():
        if line.startswith("nanhunt:") and "internal error" in line:
            print(f"{mode}: {line}")
    words = r.stdout.split()
    return {k: float(v) for k, v in zip(words[::2], words[1::2])}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--build", default=str(ROOT / "build"))
    p.add_argument("--modes", default=",".join(m for m, _ in LABELS),
                   help="comma-separated, of: " + ", ".join(m for m, _ in LABELS))
    args = p.parse_args()
    modes = [m for m, _ in LABELS if m in args.modes.split(",") or m == "plain"]
    unknown = set(args.modes.split(",")) - {m for m, _ in LABELS}
    if unknown:
        p.error(f"--modes: unknown {', '.join(sorted(unknown))}; "
                f"allowed: {', '.join(m for m, _ in LABELS)}")
    times = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(args.rounds):
            for m in modes:
                result = run(m, args, out)
                if result is not None:
                    times[m].append(result)
        failed = [m for m, runs in times.items() if not runs]
        if "plain" in failed:
            sys.exit("gpt2_bench: every plain run failed: no ratios")
        med = {m: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
               for m, runs in times.items() if runs}
        size = "tiny" if args.tiny else "GPT-2 small (12x768, seq 1024, batch 8)"
        print(f"{size}, {args.device}, fp16 autocast, {args.steps} steps x {args.rounds} rounds")
        # fwd+bwd: the GPU's time against the host's time to issue it; a
        # host time at or above the GPU's means the GPU waited for the host.
        print(f"{'mode':<28}{'step ms':>10}{'vs plain':>10}{'fwd+bwd GPU/host ms':>22}")
        for m, label in [(m, label) for m, label in LABELS if m in modes]:
            if m in failed:
                print(f"{label:<28}{'failed':>10}")
                continue
            r = med[m]
            print(f"{label:<28}{r['step_ms']:>10.2f}{r['step_ms'] / med['plain']['step_ms']:>9.2f}x"
                  f"{r['fb_gpu_ms']:>13.2f} / {r['fb_host_ms']:.2f}")
            if m in MONITORED:
                print_trace_figures(trace_meta(os.path.join(out, m)), args.steps + 3)
            if m == "empty-callbacks":
                # Model set-up included: a few hundred ops of the run's.
                print(f"{'':<4}ops a step: about {r['op_callbacks'] / (args.steps + 3):.0f} "
                      "(records the empty callback saw, set-up included)")
    if failed:
        sys.exit(f"gpt2_bench: every run of {', '.join(failed)} failed (their errors above)")


if __name__ == "__main__":
    main()
