"""A small speech recogniser trained with CTC under fp16 autocast: a strided
convolution halves the frames, a linear layer scores the labels, and
nn.CTCLoss aligns the targets. Sequences have different lengths, so CTC's
forward variables are -inf (log 0) where no alignment reaches and unwritten
past each sequence's end, in every healthy step.

    ctc_training.py [healthy|impossible|zero-infinity]

impossible: at step 3 one sample's transcript (eight repeats of a label)
needs 15 frames and its audio gives 12: CTC's loss is +inf, and its
gradient NaN spreads to the weights. zero-infinity: the same, with
nn.CTCLoss(zero_infinity=True), which zeroes that sample's loss.
DEVICE=cuda trains on a GPU (scripts/gpu-check.sh); the lengths stay in
host memory, as a DataLoader gives them.
"""
import os
import sys

import torch

mode = sys.argv[1] if len(sys.argv) > 1 else "healthy"
device = os.environ.get("DEVICE", "cpu")
torch.manual_seed(0)
LABELS = 6  # 0 is the blank
BATCH, FEATURES, FRAMES = 4, 8, 40

encoder = torch.nn.Conv1d(FEATURES, 32, kernel_size=3, stride=2, padding=1).to(device)
scorer = torch.nn.Linear(32, LABELS).to(device)
params = list(encoder.parameters()) + list(scorer.parameters())
opt = torch.optim.SGD(params, lr=0.05)
ctc = torch.nn.CTCLoss(zero_infinity=(mode == "zero-infinity"))

for step in range(6):
    audio = torch.randn(BATCH, FEATURES, FRAMES).to(device)
    audio_lengths = torch.tensor([40, 34, 30, 24])
    frame_lengths = (audio_lengths + 1) // 2  # what the stride-2 convolution leaves
    target_lengths = torch.tensor([5, 4, 3, 2])
    targets = torch.randint(1, LABELS, (BATCH, 8))
    if mode != "healthy" and step == 3:
        target_lengths[3] = 8
        targets[3] = 2  # 2 2 2 2 2 2 2 2: a blank between each, 15 frames
    with torch.autocast(device, dtype=torch.float16):
        features = encoder(audio).transpose(1, 2)
        scores = scorer(torch.relu(features))
    log_probs = scores.float().log_softmax(-1).transpose(0, 1)  # (T, N, C)
    loss = ctc(log_probs, targets.to(device), frame_lengths, target_lengths)
    opt.zero_grad()
    loss.backward()
    opt.step()
    weights_finite = all(bool(torch.isfinite(p).all()) for p in params)
    print(f"step {step} loss {loss.item():.6f} weights finite {weights_finite}")
