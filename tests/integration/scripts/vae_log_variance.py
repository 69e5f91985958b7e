"""A variational autoencoder under fp16 autocast, fed raw readings whose
scale grows along the data (a sensor's unnormalised values): the encoder's
log-variance reaches 71 at step 1, and the reparameterisation's
std = exp(0.5 * logvar) passes fp16's 65504 (from an argument of 11.09 on).
The KL term's exp(logvar) follows. Prints each step's loss."""
import torch

torch.manual_seed(0)
encoder = torch.nn.Linear(32, 16)
decoder = torch.nn.Linear(8, 32)
opt = torch.optim.Adam([*encoder.parameters(), *decoder.parameters()], lr=1e-3)
for step in range(4):
    x = torch.randn(64, 32) * (1 + step * 30)
    with torch.autocast("cpu", dtype=torch.float16):
        mu, logvar = encoder(x).chunk(2, dim=-1)
        std = torch.exp(0.5 * logvar)
        z = mu + std * torch.randn_like(std)
        reconstruction = torch.nn.functional.mse_loss(decoder(z).float(), x)
        kl = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
        loss = reconstruction + kl
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6g}", flush=True)
