"""Losses written by hand that go NaN for a reason of their own, not fp16's
range; each is a pattern users write and nanhunt must explain.

    losses_out_of_domain.py MODE

arcface  acos of a cosine between unit vectors: at step 2 one embedding is
         its class's weight itself, and the cosine rounds to 1.0000001,
         past acos's domain (the fix, clamp, is MODE arcface-clamped)
arcface-fp16
         the same under fp16 autocast, where at step 2 one embedding is
         within 1e-5 of its class's weight: the fp16 cosine rounds to
         exactly 1, where acos is finite and its derivative infinite
         (the fix, a clamp 1e-3 inside, is MODE arcface-fp16-clamped)
std      GRPO-style advantages, (r - mean) / (std + eps) per group: at
         step 2 a group has one sample, whose std (Bessel's N - 1) is NaN
focal    a focal loss with gamma = 0.5: at step 2 the model is certain,
         p = 1, and (1 - p) ** 0.5 has an infinite derivative at 0
bce      binary cross-entropy by hand on a .half() model: sigmoid rounds
         to 1 in fp16 from a logit of 8.3, and log(1 - p) is -inf
bce-log1p
         the same with F.logsigmoid(z) for log(p) and torch.log1p(-p) for
         log(1 - p): log1p(-1) is -inf (the fix, p.clamp_max(1 - 1e-3)
         before it, is MODE bce-log1p-clamped)
logit    a student regressing a teacher's logits, torch.logit of its soft
         labels: at step 2 a hard label (exactly 1) is among them, whose
         logit is +inf (the fix, torch.logit(p, eps=1e-6), is MODE
         logit-eps)
logit-half
         the same with that fix over float16 soft labels, where 1 - 1e-6
         rounds to 1 and the logit is +inf again (the fix, eps=1e-3, is
         MODE logit-half-eps)
nb       a negative binomial likelihood of counts (scVI's), written with
         torch.lgamma, whose per-gene dispersion is a ReLU: at step 2 one
         gene's is 0, and lgamma(0) is +inf (the fix, softplus plus a
         floor, is MODE nb-softplus)

Prints each step's loss and whether the weights are finite."""
import sys

import torch
import torch.nn.functional as F

MODE = sys.argv[1]
torch.manual_seed(0)


def report(step, loss, params):
    finite = all(bool(torch.isfinite(p).all()) for p in params)
    print(f"step {step} loss {loss.item():.6f} weights finite {finite}", flush=True)


def arcface(clamped, fp16=False):
    embed = torch.nn.Linear(16, 8)
    centers = torch.nn.Parameter(torch.randn(10, 8))
    params = [*embed.parameters(), centers]
    opt = torch.optim.SGD(params, lr=0.1)
    x, y = torch.randn(32, 16), torch.randint(0, 10, (32,))
    margin = 1e-3 if fp16 else 1e-7
    for step in range(4):
        f = F.normalize(embed(x), dim=1)
        w = F.normalize(centers, dim=1)
        if step == 2 and fp16:  # a sample next to its class's center
            f = torch.cat([F.normalize(w[y[:1]] + 1e-5 * f[:1], dim=1), f[1:]])
        elif step == 2:  # a sample on its class's center, rounded past it
            f = torch.cat([w[y[:1]] * 1.0000001, f[1:]])
        with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
            cos = f @ w.t()
        if clamped:
            cos = cos.clamp(-1 + margin, 1 - margin)
        theta = torch.acos(cos.float())
        loss = F.cross_entropy(30 * torch.cos(theta + 0.5 * F.one_hot(y, 10)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        report(step, loss, params)


def std_of_groups():
    policy = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    for step in range(4):
        obs, rewards = torch.randn(9, 4), torch.randn(9)
        sizes = [4, 4, 1] if step == 2 else [3, 3, 3]
        adv = torch.cat([(g - g.mean()) / (g.std() + 1e-4) for g in rewards.split(sizes)])
        loss = -(adv * policy(obs).squeeze(-1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        report(step, loss, policy.parameters())


def focal():
    model = torch.nn.Linear(8, 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 5, (32,))
    for step in range(4):
        logits = model(x)
        if step == 2:  # certain of every sample: p rounds to 1
            logits = logits + 200.0 * F.one_hot(y, 5)
        logp = F.log_softmax(logits, -1).gather(1, y[:, None]).squeeze(1)
        loss = (-(1 - logp.exp()) ** 0.5 * logp).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        report(step, loss, model.parameters())


def bce_by_hand(log1p=False, clamped=False):
    model = torch.nn.Linear(8, 1).half()
    opt = torch.optim.SGD(model.parameters(), lr=2.0)
    x = torch.randn(64, 8).half() * 10
    y = (torch.rand(64, 1) > 0.5).half()
    for step in range(3):
        z = model(x)
        p = torch.sigmoid(z)
        if log1p:
            loss = -(y * F.logsigmoid(z) + (1 - y) * torch.log1p(
                -(p.clamp_max(1 - 1e-3) if clamped else p))).mean()
        else:
            loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        report(step, loss, model.parameters())


def logit_targets(eps, half=False):
    student = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    x = torch.randn(32, 8)
    for step in range(4):
        soft = torch.rand(32, 4) * 0.8 + 0.1
        if step == 2:  # a hard label among the soft ones
            soft[5, 1] = 1.0
        if half:  # the teacher's probabilities, in float16
            soft = soft.half()
        targets = torch.logit(soft, eps=eps).float()
        loss = F.mse_loss(student(x), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        report(step, loss, student.parameters())


def negative_binomial(softplus):
    genes = 6
    encoder = torch.nn.Linear(genes, genes)
    raw_dispersion = torch.nn.Parameter(torch.full((genes,), 2.0))
    params = [*encoder.parameters(), raw_dispersion]
    opt = torch.optim.SGD(params, lr=1e-3)
    counts = torch.poisson(torch.full((32, genes), 3.0))
    for step in range(4):
        if step == 2:  # as an update can drive it: one gene's below 0
            with torch.no_grad():
                raw_dispersion[3] = -0.5
        mu = F.softplus(encoder(counts.log1p()))
        theta = F.softplus(raw_dispersion) + 1e-4 if softplus else F.relu(raw_dispersion)
        log_likelihood = (
            torch.lgamma(counts + theta) - torch.lgamma(theta) - torch.lgamma(counts + 1)
            + theta * (torch.log(theta + 1e-8) - torch.log(theta + mu + 1e-8))
            + counts * (torch.log(mu + 1e-8) - torch.log(theta + mu + 1e-8)))
        loss = -log_likelihood.sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        report(step, loss, params)


{"arcface": lambda: arcface(False), "arcface-clamped": lambda: arcface(True),
 "arcface-fp16": lambda: arcface(False, fp16=True),
 "arcface-fp16-clamped": lambda: arcface(True, fp16=True),
 "std": std_of_groups, "focal": focal, "bce": bce_by_hand,
 "bce-log1p": lambda: bce_by_hand(log1p=True),
 "bce-log1p-clamped": lambda: bce_by_hand(log1p=True, clamped=True),
 "logit": lambda: logit_targets(None), "logit-eps": lambda: logit_targets(1e-6),
 "logit-half": lambda: logit_targets(1e-6, half=True),
 "logit-half-eps": lambda: logit_targets(1e-3, half=True),
 "nb": lambda: negative_binomial(False), "nb-softplus": lambda: negative_binomial(True)}[MODE]()
