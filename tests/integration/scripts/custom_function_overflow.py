# A custom autograd.Function whose backward scales its gradient past fp16's
# range: its backward findings name the Function as their forward op. Its
# record is named by a string that lives only while the forward runs, so
# the name must be kept (it read as "" or garbage in backward).
import torch


class Blowup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        return grad * 1e5


x = torch.ones(4, dtype=torch.float16, requires_grad=True)
for step in range(3):
    y = Blowup.apply(x * 2)
    (y.sum() * 1000).backward()
print(x.grad)
