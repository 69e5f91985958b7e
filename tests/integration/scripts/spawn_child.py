# A parent without torch that starts a child that imports torch.
import subprocess
import sys

code = "import torch; print((torch.ones(2) * 2).sum().item())"
sys.exit(subprocess.call([sys.executable, "-c", code]))
