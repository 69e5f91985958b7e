# A non-finite value that comes from the data, not from an op.
import torch

print(torch.softmax(torch.tensor([float("inf"), 1.0]), 0))
