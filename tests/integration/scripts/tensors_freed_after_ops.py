# Each case makes a tensor with an op, drops the last reference to it, and
# asks a weakref whether it is gone, before any other op runs: a monitor
# that kept an op's inputs or outputs past its end would keep it alive (its
# memory, and its Python object). Prints one line per case.
import threading
import weakref

import torch
import torch.nn.functional as F

x = torch.randn(64, 64)
w = torch.randn(64, 64, requires_grad=True)


def report(case, make):
    t = make()
    ref = weakref.ref(t)
    del t
    print(case, "freed" if ref() is None else "alive", flush=True)


report("out-of-place", lambda: x * 2)
report("in-place", lambda: torch.ones(64).mul_(3))
report("composite", lambda: F.layer_norm(x, (64,)))
report("view", lambda: torch.randn(8, 8).t())
report("non-finite", lambda: torch.tensor([3e38, 1.0]) * 10)
report("fp16 near-max", lambda: torch.full((4,), 60000.0, dtype=torch.float16) + 1)
report("gradient", lambda: torch.autograd.grad((x @ w).sum(), w)[0])


def on_a_thread(made):
    made.append(x + 1)


made = []
thread = threading.Thread(target=on_a_thread, args=(made,))
thread.start()
thread.join()
report("made on an ended thread", made.pop)
