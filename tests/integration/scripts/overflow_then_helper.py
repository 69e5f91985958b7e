# The training overflows, then starts a helper Python that loads torch (as
# torch.compile's probe of a freshly built kernel does, or an evaluation
# script run from the training). Under a plain LD_PRELOAD the helper writes
# a trace of its own, newer than the training's: `nanhunt view` on the
# folder must still show the training's origin.
import os
import subprocess
import sys

import torch

z = torch.full((4,), 300.0, dtype=torch.float16)
print((z @ z).item())
helper = "import torch; print(torch.ones(3).sum().item())"
subprocess.run([sys.executable, "-c", helper], env=dict(os.environ), check=True)
