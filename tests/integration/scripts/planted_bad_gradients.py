# Non-finite gradients planted at chosen steps, for every torch.optim form
# nanhunt promises to skip the way GradScaler does. After each step the
# parameters and the optimizer state are saved to argv[1].
#
# REFERENCE=1: the script itself leaves optimizer.step() out at the planted
# steps (and plants nothing), which is what nanhunt's skipping must equal,
# bit for bit. Run plain, it plants and steps: the harm to prevent.
import copy
import os
import sys

import torch

PLANTED = {3, 4, 7}
STEPS = 10
FORMS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("Adam", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
]
IMPLEMENTATIONS = {
    "for-loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}
reference = os.environ.get("REFERENCE") == "1"


def snapshot(model, opt):
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "state": copy.deepcopy(opt.state_dict()["state"]),
    }


history = {}
for name, kwargs in FORMS:
    for impl, impl_kwargs in IMPLEMENTATIONS.items():
        form = f"{name}{'+momentum' if 'momentum' in kwargs else ''} {impl}"
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
        opt = getattr(torch.optim, name)(model.parameters(), **kwargs, **impl_kwargs)
        x, y = torch.randn(32, 6), torch.randn(32, 1)
        states = [snapshot(model, opt)]
        for step in range(STEPS):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            bad = step in PLANTED
            if bad and not reference:
                loss = loss * float("inf")  # every gradient becomes inf/NaN
            loss.backward()
            if not (bad and reference):
                opt.step()
            states.append(snapshot(model, opt))
        history[form] = states
        print(form, "final loss", float(loss), flush=True)
torch.save(history, sys.argv[1])
