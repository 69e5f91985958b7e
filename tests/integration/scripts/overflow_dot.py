# The incident's minimal reproduction: 300*300*4 = 360000 > 65504.
import torch

x = torch.full((4,), 300.0, dtype=torch.float16)
print(x @ x)
