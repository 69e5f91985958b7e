"""Knowledge distillation with the KL divergence written by hand,
(p * (p.log() - logq)).sum(-1): the teacher runs in fp16 and is confident,
so its softmax is exactly 0 for most classes. There p.log() is -inf, and
0 * -inf is NaN: the loss reads NaN from step 0 (the student's gradient,
-p, stays finite, so only the loss shows it, and whatever watches it).

    distillation_kl_by_hand.py [by-hand|kl_div]

kl_div: F.kl_div(logq, p, reduction="batchmean"), which is 0 where p is 0.
Prints each step's loss and whether the student's weights are finite."""
import sys

import torch
import torch.nn.functional as F

by_hand = (sys.argv[1] if len(sys.argv) > 1 else "by-hand") == "by-hand"
torch.manual_seed(0)
teacher = torch.nn.Linear(32, 100).half()
with torch.no_grad():
    teacher.weight.mul_(40)  # a trained teacher's confident logits
student = torch.nn.Linear(32, 100)
opt = torch.optim.SGD(student.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(16, 32)
    with torch.no_grad():
        p = F.softmax(teacher(x.half()), dim=-1).float()
    logq = F.log_softmax(student(x), dim=-1)
    if by_hand:
        loss = (p * (p.log() - logq)).sum(-1).mean()
    else:
        loss = F.kl_div(logq, p, reduction="batchmean")
    opt.zero_grad()
    loss.backward()
    opt.step()
    finite = all(bool(w.isfinite().all()) for w in student.parameters())
    print(f"step {step} loss {loss.item():.4f} weights finite {finite} "
          f"teacher zeros {int((p == 0).sum())}")
