# torch's recipe for a compiled optimizer step (torch.compile of a function
# that calls opt.step()), after one eager step (nanhunt's optimizer hooks
# are installed at the first optimizer record). Prints the trained weights'
# sum and how many times Dynamo broke the graph: nanhunt's hooks, traced
# into the compiled step, must add no break (fullgraph=True would fail).
import torch
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = torch.nn.Linear(16, 16)
opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(1e-3))


@torch.compile
def compiled_step():
    opt.step()


for i in range(4):
    model(torch.randn(4, 16)).square().mean().backward()
    if i == 0:
        opt.step()
    else:
        compiled_step()
    opt.zero_grad()
print("weights", model.weight.sum().item())
print("graph breaks", sum(counters["graph_break"].values()))
