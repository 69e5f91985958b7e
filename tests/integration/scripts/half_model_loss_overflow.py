# A model converted with .half(), no autocast, whose MSE loss overflows in
# fp16: one target is 300 off, and its square (90000) passes 65504 although
# the mean (about 1400) fits. Prints each step's loss, its dtype, and
# whether all gradients were finite.
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1).half()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(64, 4).half()
y = torch.zeros(64, 1).half()
y[0] = 300
for step in range(5):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    opt.step()
    print(f"step {step} loss {float(loss):.4f} dtype {loss.dtype} "
          f"grads_finite {int(finite)}", flush=True)
