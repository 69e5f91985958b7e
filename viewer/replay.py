"""nanhunt replay SNAPSHOT: re-runs the op a NaN-guard snapshot holds, with
its floating-point arguments in fp16, bf16 and fp32, and says which stay
finite and how large the results get. Run by `nanhunt replay` with the
Python that has torch."""
import math
import sys

import torch

FP16_MAX = 65504.0


def cast(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(cast(v, dtype) for v in value)
    return value


def tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors(v)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: nanhunt replay SNAPSHOT")
    snap = torch.load(sys.argv[1], weights_only=False)
    name = snap["op"].split("::", 1)[1]
    packet = getattr(torch.ops.aten, name)
    op = getattr(packet, snap["overload"] or "default")
    finding = snap["finding"]
    print(f"{snap['op']}{'.' + snap['overload'] if snap['overload'] else ''}"
          f" ({finding['phase']}, step {finding['step']}"
          f"{', ' + finding['source'] if finding['source'] else ''})")
    for i, (arg, name_) in enumerate(zip(snap["args"], snap["arg_names"])):
        if isinstance(arg, torch.Tensor):
            finite = arg[torch.isfinite(arg)]
            peak = finite.abs().max().item() if finite.numel() else float("nan")
            print(f"  arg {name_}: {arg.dtype} {list(arg.shape)} max|x|={peak:.6g}")
    print(f"{'dtype':<10}{'finite':>8}{'max|x|':>14}{'nan':>8}{'inf':>8}")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        args, kwargs = [], {}
        for value, arg_name, kw in zip(snap["args"], snap["arg_names"], snap["kwarg_only"]):
            value = cast(value, dtype)
            if kw:
                kwargs[arg_name] = value
            else:
                args.append(value)
        try:
            out = op(*args, **kwargs)
        except Exception as e:  # an op that does not run in this dtype
            print(f"{str(dtype).split('.')[1]:<10}  cannot run: {e}")
            continue
        outs = list(tensors(out))
        nan = sum(int(torch.isnan(t).sum()) for t in outs)
        inf = sum(int(torch.isinf(t).sum()) for t in outs)
        finite = [t[torch.isfinite(t)] for t in outs]
        peak = max((t.abs().max().item() for t in finite if t.numel()), default=0.0)
        print(f"{str(dtype).split('.')[1]:<10}{'yes' if nan + inf == 0 else 'NO':>8}"
              f"{peak:>14.6g}{nan:>8}{inf:>8}")


if __name__ == "__main__":
    main()
