"""A per-class Dice loss for segmentation: a class absent from the batch
has no Dice, and the program marks it NaN on purpose, then averages the
classes with torch.nanmean, which skips the markers. Class 3 never
appears: a healthy run, whose steps hold no inf/NaN but the markers.

    nan_marked_classes.py [where|scalar|masked_fill|index] [nanmean|mean]

How the marker is placed: torch.where with a tensor of NaN, or with a
Python float; masked_fill; an index assignment. mean: x.mean() instead of
torch.nanmean, which the markers make NaN from step 0 on. DEVICE=cuda runs
it on the GPU. Prints each step's loss and whether the weights are
finite."""
import os
import sys

import torch
import torch.nn.functional as F

placement = sys.argv[1] if len(sys.argv) > 1 else "where"
reduce = sys.argv[2] if len(sys.argv) > 2 else "nanmean"
device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
classes = 4
model = torch.nn.Conv2d(3, classes, 3, padding=1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(2, 3, 16, 16, device=device)
    target = torch.randint(0, classes - 1, (2, 16, 16), device=device)  # no class 3
    probs = model(x).softmax(1)
    onehot = F.one_hot(target, classes).permute(0, 3, 1, 2).float()
    overlap = (probs * onehot).sum((0, 2, 3))
    present = onehot.sum((0, 2, 3))
    dice = 2 * overlap / (probs.sum((0, 2, 3)) + present)
    absent = present == 0
    if placement == "where":
        dice = torch.where(absent, torch.tensor(float("nan"), device=device), dice)
    elif placement == "scalar":
        dice = torch.where(absent, float("nan"), dice)
    elif placement == "masked_fill":
        dice = dice.masked_fill(absent, float("nan"))
    else:
        dice = dice.clone()
        dice[absent] = float("nan")
    loss = 1 - (torch.nanmean(dice) if reduce == "nanmean" else dice.mean())
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(p.isfinite().all()) for p in model.parameters())
    print(f"step {step} loss {loss.item():.4f} weights finite {finite}")
