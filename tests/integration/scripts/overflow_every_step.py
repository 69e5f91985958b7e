# Overflows in fp16 every step, slowly, until stopped.
import time

import torch

try:
    for step in range(400):
        z = torch.full((4,), 300.0, dtype=torch.float16)
        (z @ z).item()
        print("step", step, flush=True)
        time.sleep(0.05)
except FloatingPointError as e:
    print("caught |", e, flush=True)
