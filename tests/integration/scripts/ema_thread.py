# Training on the main thread while a second thread keeps an exponential
# moving average of the weights, as an async EMA or checkpoint helper does:
# its ops run between and during the training's (torch releases the GIL in
# each op), on parameters, under no_grad. The input is scaled past fp16's
# range from iteration 5 on, so the first linear overflows there.
import threading

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
ema = [p.detach().clone() for p in model.parameters()]
stop = threading.Event()
ema_updates = 0


def keep_ema():
    global ema_updates
    while not stop.is_set():
        with torch.no_grad():
            for e, p in zip(ema, model.parameters()):
                e.lerp_(p.detach(), 0.01)
        ema_updates += 1


helper = threading.Thread(target=keep_ema, daemon=True)
helper.start()
x, y = torch.randn(512, 64), torch.randn(512, 1)
for step in range(12):
    opt.zero_grad()
    scale = 3000.0 if step >= 5 else 1.0
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x * scale)  # overflows from iteration 5 on
    loss = torch.nn.functional.mse_loss(out.float(), y)
    loss.backward()
    opt.step()
    print("step", step, "loss", loss.item(), flush=True)
stop.set()
helper.join()
print("ema updates", ema_updates)
