"""How many checks a held-back batch (NANHUNT_GPU_BATCH=32) would carry in a
GPT-2 training step, and how many batches a step would take, under two
flush rules: at every op that writes an argument (the first version), and
only at writes to memory a held check reads (core/check_batches.h now).

Runs bench/gpt2_step.py's model under torch's ExecutionTraceObserver, which
records every op with its schema and the storage of each input and output,
then replays the plugin's policy over that op stream: outputs of ops that
are not views, not uninitialised (empty) and not CompositeImplicitAutograd
are held, and kept alive (a storage id the recorded run freed and reused
for a new output is renamed); an op's start flushes when it writes held
memory, or has no schema (autograd's detach records aside); 32 held flush. No GPU needed
(`--device cpu --tiny`); on a GPU machine `--device cuda` replays CUDA's op
stream. A model of what enqueue_checks.cc does, not nanhunt itself: the
GPU run's trace (meta device_checks / device_check_batches) is the figure.

  .venv/bin/python bench/batch_replay.py --device cpu --tiny
"""
import argparse
import json
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ExecutionTraceObserver

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpt2_step  # noqa: E402

MAX_CHECKS = 32
FLOATING = ("float", "double", "c10::Half", "c10::BFloat16", "c10::Float8_e4m3fn",
            "c10::Float8_e5m2")
UNINITIALISED = ("aten::empty", "aten::new_empty", "aten::_empty", "aten::resize_")
PASSES_INPUT = {"aten::_unsafe_view", "aten::lift_fresh", "aten::_reshape_alias",
                "aten::alias", "aten::detach", "aten::lift"}
WRITES_NO_VALUES = {"detach", "detach_"}
# at::RecordScope: the plugin's op callbacks skip autograd nodes and
# record_function scopes (optimizer steps).
NOT_OPS = {1, 7}  # BACKWARD_FUNCTION, USER_SCOPE


def record(args, path):
    """Runs `args.steps` training steps under the observer (after warm-up)."""
    sys.argv = ["gpt2_step.py", "--device", args.device, "--steps", str(args.steps),
                "--foreach"] + (["--tiny"] if args.tiny else [])
    observer = ExecutionTraceObserver().register_callback(str(path))
    gpt2_step.STEP_HOOK = (observer.start, observer.stop)
    gpt2_step.main()
    observer.unregister_callback()


class Traits:
    """What the plugin's TraitsOf reads from the schema."""

    def __init__(self, node):
        attrs = {a["name"]: a["value"] for a in node.get("attrs", [])}
        self.name = node["name"]
        self.scope = attrs.get("scope", 0)
        schema = attrs.get("op_schema", "")
        self.has_schema = bool(schema)
        self.written = []  # argument positions written ("Tensor(a!)")
        self.view = False
        if schema:
            params, returns = schema.split(") -> ", 1) if ") -> " in schema else (schema, "")
            args = [a for a in re.split(r",\s*", params.split("(", 1)[1]) if a != "*"]
            self.written = [i for i, a in enumerate(args) if "!)" in a]
            rets = [r for r in re.split(r",\s*", returns.strip("()")) if r]
            self.view = bool(not self.written and rets and all("(" in r for r in rets))
        self.view = self.view or self.name in PASSES_INPUT
        self.composite = self.has_schema and torch._C._dispatch_has_kernel_for_dispatch_key(
            schema.split("(", 1)[0], "CompositeImplicitAutograd")


def storages(value, kind):
    """Storage ids of the tensors in an input or output value."""
    if kind.startswith("Tensor(") and isinstance(value, list) and len(value) == 6:
        return [value[1]]
    if kind.startswith("GenericList") and isinstance(value, list):
        return [v[1] for v in value if isinstance(v, list) and len(v) == 6]
    return []


class Replay:
    def __init__(self, every_write):
        self.every_write = every_write
        self.held = []  # storage ids
        self.flushes = self.full = self.checks = 0

    def flush(self):
        if self.held:
            self.flushes += 1
            self.checks += len(self.held)
            self.held = []

    def start(self, node, traits):
        if not self.held:
            return
        if not traits.has_schema:
            if traits.name not in WRITES_NO_VALUES:
                self.flush()
            return
        if self.every_write:
            if traits.written:
                self.flush()
            return
        values, types = node["inputs"]["values"], node["inputs"]["types"]
        written = {s for i in traits.written if i < len(values)
                   for s in storages(values[i], types[i])}
        if written & set(self.held):
            self.flush()

    def end(self, node, traits):
        if not traits.has_schema or traits.view:
            return
        values, types = node["outputs"]["values"], node["outputs"]["types"]
        if not traits.written:
            # A new output in memory a held output had: the recorded run
            # (nothing held) freed that memory and reused it, which a held
            # tensor prevents. Renamed, so that writes to the new output do
            # not count as writes to the held one.
            fresh = {s for v, t in zip(values, types) for s in storages(v, t)}
            self.held = [object() if s in fresh else s for s in self.held]
        if traits.name.startswith(UNINITIALISED) or traits.composite:
            return
        for v, t in zip(values, types):
            if any(f"({f})" in t for f in FLOATING) or (t.startswith("GenericList") and
                                                         any(f in t for f in FLOATING)):
                self.held.extend(storages(v, t))
        if len(self.held) >= MAX_CHECKS:
            self.full += 1
            self.flush()


def replay(nodes, every_write):
    children = defaultdict(list)
    for n in nodes:
        if n["id"] != n.get("ctrl_deps"):  # the process node is its own parent
            children[n.get("ctrl_deps")].append(n)
    r = Replay(every_write)
    ops = 0

    def visit(n):
        nonlocal ops
        traits = Traits(n)
        is_op = (traits.scope not in NOT_OPS and
                 not traits.name.startswith(("[pytorch", "autograd::", "profiler::")))
        if is_op:
            ops += 1
            r.start(n, traits)
        for c in sorted(children[n["id"]], key=lambda c: c["id"]):
            visit(c)
        if is_op:
            r.end(n, traits)

    for root in sorted(children[1], key=lambda c: c["id"]):
        visit(root)
    r.flush()
    return ops, r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        record(args, path)
        nodes = json.loads(path.read_text())["nodes"]
    print(f"{args.steps} steps of bench/gpt2_step.py --device {args.device}"
          f"{' --tiny' if args.tiny else ''} --foreach, batches of {MAX_CHECKS}:")
    for every_write, rule in ((True, "flush at every write"),
                              (False, "flush at writes to held memory")):
        ops, r = replay(nodes, every_write)
        print(f"  {rule:32s} {r.flushes / args.steps:7.1f} batches a step, "
              f"{r.checks / max(1, r.flushes):5.1f} checks a batch "
              f"({r.full / args.steps:.1f} a step full), {ops / args.steps:.0f} ops a step")


if __name__ == "__main__":
    main()
