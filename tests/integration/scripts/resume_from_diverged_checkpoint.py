# Resuming from a checkpoint saved after the run that wrote it had
# diverged: the inf/NaN come with the model or the optimizer, and the first
# batch is blamed by hand (and was by nanhunt) for what is the checkpoint's.
#   save-nan-weight PATH   a NaN in the last layer's weight, as an update
#                          that overflowed leaves it
#   save-inf-adam PATH     an inf in Adam's exp_avg_sq of that weight (a
#                          squared gradient past fp16's range)
#   save-nan-weight-fp16 PATH  as save-nan-weight, the model saved in fp16
#                          (load_state_dict converts it back: a copy_ that
#                          checks what it copies)
#   resume PATH [foreach|assign]  loads the checkpoint and trains three
#                          steps under fp16 autocast; "foreach": Adam's
#                          foreach update; "assign": the model takes the
#                          loaded tensors as they are
#                          (load_state_dict(..., assign=True), as after
#                          building it on the meta device), and its
#                          optimizer is made after
# DEVICE=cuda trains on the GPU; the checkpoint is then loaded straight
# onto it, as torch.load does with what a GPU run saved.
import os
import sys

import torch

mode, path = sys.argv[1], sys.argv[2]
foreach = sys.argv[3:] == ["foreach"]
assign = sys.argv[3:] == ["assign"]
device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
model.to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)


def train(steps):
    for step in range(steps):
        x, y = torch.randn(32, 8, device=device), torch.randn(32, 1, device=device)
        with torch.autocast(device, dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, loss.item())


if mode == "resume":
    checkpoint = torch.load(path)
    model.load_state_dict(checkpoint["model"], assign=assign)
    if assign:  # the parameters are new tensors: an optimizer of them
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.load_state_dict(checkpoint["optimizer"])
    train(3)
    sys.exit(0)
train(2)
with torch.no_grad():
    if mode.startswith("save-nan-weight"):
        model[2].weight[0, 3] = float("nan")
    else:
        assert mode == "save-inf-adam", mode
        opt.state[model[2].weight]["exp_avg_sq"][0, 3] = float("inf")
weights = model.state_dict()
if mode.endswith("-fp16"):
    weights = {name: value.half() for name, value in weights.items()}
torch.save({"model": weights, "optimizer": opt.state_dict()}, path)
