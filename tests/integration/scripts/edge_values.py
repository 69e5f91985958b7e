"""Ops at edge values: each case builds a tensor from a weight w (a row of
zeros, repeated values, equal rows; NEG: rows masked with -inf, one of
them entirely), applies an op, sums it into a loss, runs backward and an
SGD step (lr 0), then sets w back to ones: one training step a case, in
the order listed. Where torch's own formulas make inf/NaN on the way and
drop them (a norm's backward at a zero vector, cumprod's at a zero,
pinv's reciprocal of a zero singular value), the loss and the gradient
are finite, and the run is healthy. Not here: inf/NaN a formula makes and
the program drops after it (acos at 1 behind a clamp, logsumexp of a row
masked whole behind its masked_fill, F.lp_pool's power at 0 behind its
ReLU): those are origins of a run whose values were dropped.

    edge_values.py [CASE ...]

Prints "CASE name loss_finite X grad_finite Y" for each case run (all
without arguments); Y is the error where the op refused its input."""
import sys

import torch
import torch.nn.functional as F

w = torch.nn.Parameter(torch.ones(4, 6))
opt = torch.optim.SGD([w], lr=0.0)


def Z():
    return w * torch.tensor([[0., 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6], [0, 1, 0, 2, 0, 3],
                             [1, 1, 1, 1, 1, 1]])


def NEG():
    return Z().masked_fill(torch.tensor([[True] * 6, [False] * 6, [True, False] * 3, [False] * 6]),
                           float("-inf"))


cases = {
    'prod': lambda: Z().prod(1),
    'prod_all': lambda: Z().prod(),
    'cumprod': lambda: Z().cumprod(1),
    'logcumsumexp': lambda: Z().logcumsumexp(1),
    'logsumexp': lambda: Z().logsumexp(1),
    'softmax': lambda: F.softmax(Z(), 1),
    'log_softmax': lambda: F.log_softmax(Z(), 1),
    'norm2': lambda: Z().norm(dim=1),
    'norm1': lambda: Z().norm(p=1, dim=1),
    'norm3': lambda: Z().norm(p=3, dim=1),
    'norminf': lambda: Z().norm(p=float('inf'), dim=1),
    'norm0.5': lambda: Z().norm(p=0.5, dim=1),
    'vector_norm': lambda: torch.linalg.vector_norm(Z(), dim=1),
    'matrix_norm_fro': lambda: torch.linalg.matrix_norm(Z()),
    'matrix_norm_nuc': lambda: torch.linalg.matrix_norm(Z(), 'nuc'),
    'matrix_norm_2': lambda: torch.linalg.matrix_norm(Z(), 2),
    'svdvals': lambda: torch.linalg.svdvals(Z()),
    'std': lambda: Z().std(1),
    'var': lambda: Z().var(1),
    'std_mean': lambda: torch.std_mean(Z(), 1)[0],
    'var_mean': lambda: torch.var_mean(Z(), 1)[0],
    'layer_norm': lambda: F.layer_norm(Z(), (6,)),
    'group_norm': lambda: F.group_norm(Z()[None], 2),
    'instance_norm': lambda: F.instance_norm(Z()[None]),
    'batch_norm': lambda: F.batch_norm(Z().t(), None, None, training=True),
    'rms_norm': lambda: F.rms_norm(Z(), (6,)),
    'normalize': lambda: F.normalize(Z(), dim=1),
    'cosine_similarity': lambda: F.cosine_similarity(Z(), Z().flip(0)),
    'pairwise_distance': lambda: F.pairwise_distance(Z(), Z()),
    'cdist': lambda: torch.cdist(Z(), Z()),
    'cdist_p1': lambda: torch.cdist(Z(), Z(), p=1),
    'cdist_p3': lambda: torch.cdist(Z(), Z(), p=3),
    'cdist_mm': lambda: torch.cdist(Z().repeat(7, 1), Z().repeat(7, 1),
                                    compute_mode='use_mm_for_euclid_dist'),
    'pdist': lambda: F.pdist(Z()),
    'dist': lambda: torch.dist(Z()[0], Z()[0]),
    'sinc': lambda: torch.sinc(Z()),
    'copysign': lambda: torch.copysign(Z(), -1.0),
    'sqrt': lambda: Z().sqrt(),
    'rsqrt': lambda: Z().rsqrt(),
    'pow0.5': lambda: Z().pow(0.5),
    'pow0': lambda: Z().pow(0),
    'pow_t': lambda: Z().pow(Z()),
    'pow_t1': lambda: Z().pow(Z() + 1),
    'xlogy': lambda: torch.xlogy(Z(), Z()),
    'xlog1py': lambda: torch.special.xlog1py(Z(), Z() - 1),
    'entr': lambda: torch.special.entr(Z()),
    'log': lambda: Z().log(),
    'abs': lambda: Z().abs(),
    'sign': lambda: Z().sign(),
    'atan2': lambda: torch.atan2(Z(), Z()),
    'hypot': lambda: torch.hypot(Z(), Z()),
    'angle': lambda: torch.angle(torch.complex(Z(), Z())),
    'sgn': lambda: torch.sgn(torch.complex(Z(), Z())),
    'abs_c': lambda: torch.complex(Z(), Z()).abs(),
    'polar': lambda: torch.polar(Z(), Z()).real,
    'div': lambda: Z() / (Z() + 1),
    'fmod': lambda: torch.fmod(Z(), Z() + 1),
    'remainder': lambda: torch.remainder(Z(), Z() + 1),
    'maximum': lambda: torch.maximum(Z(), Z()),
    'max': lambda: Z().max(1)[0],
    'amax': lambda: Z().amax(1),
    'median': lambda: Z().median(1)[0],
    'kthvalue': lambda: Z().kthvalue(2, 1)[0],
    'sort': lambda: Z().sort(1)[0],
    'topk': lambda: Z().topk(2, 1)[0],
    'clamp': lambda: Z().clamp(0, 1),
    'relu': lambda: F.relu(Z()),
    'gelu': lambda: F.gelu(Z()),
    'silu': lambda: F.silu(Z()),
    'mish': lambda: F.mish(Z()),
    'softplus': lambda: F.softplus(Z(), beta=100),
    'elu': lambda: F.elu(Z()),
    'logsigmoid': lambda: F.logsigmoid(Z()),
    'erfinv': lambda: torch.erfinv(Z().clamp(-1, 1) * 0.5),
    'cross_entropy': lambda: F.cross_entropy(Z(), torch.tensor([0, 1, 2, 3])),
    'ce_smooth': lambda: F.cross_entropy(Z(), torch.tensor([0, 1, 2, 3]), label_smoothing=0.1),
    'ce_probs': lambda: F.cross_entropy(Z(), F.softmax(Z().detach(), 1)),
    'nll': lambda: F.nll_loss(F.log_softmax(Z(), 1), torch.tensor([0, 1, 2, 3])),
    'kl_div': lambda: F.kl_div(F.log_softmax(Z(), 1), torch.tensor([[0., 1, 0, 0, 0, 0]] * 4),
                               reduction='batchmean'),
    'kl_div_log_target': lambda: F.kl_div(F.log_softmax(Z(), 1), F.log_softmax(Z(), 1),
                                          log_target=True, reduction='batchmean'),
    'bce_logits': lambda: F.binary_cross_entropy_with_logits(Z(), torch.ones(4, 6)),
    'bce': lambda: F.binary_cross_entropy(Z().clamp(0, 1), torch.ones(4, 6)),
    'smooth_l1': lambda: F.smooth_l1_loss(Z(), Z().detach()),
    'huber': lambda: F.huber_loss(Z(), Z().detach()),
    'l1': lambda: F.l1_loss(Z(), Z().detach()),
    'mse': lambda: F.mse_loss(Z(), Z().detach()),
    'poisson_nll': lambda: F.poisson_nll_loss(Z(), Z().detach(), log_input=False),
    'gaussian_nll': lambda: F.gaussian_nll_loss(Z(), Z().detach(), Z().abs() + 1e-6),
    'cosine_embedding': lambda: F.cosine_embedding_loss(Z(), Z(), torch.ones(4)),
    'triplet': lambda: F.triplet_margin_loss(Z(), Z(), Z()),
    'margin_ranking': lambda: F.margin_ranking_loss(Z()[0], Z()[1], torch.ones(6)),
    'ctc': lambda: F.ctc_loss(F.log_softmax(Z()[:, None].expand(4, 1, 6).contiguous(), 2),
                              torch.tensor([[1, 2]]), torch.tensor([4]), torch.tensor([2])),
    'sdpa': lambda: F.scaled_dot_product_attention(Z()[None], Z()[None], Z()[None]),
    'mha': lambda: F.multi_head_attention_forward(
        Z()[:, None, :], Z()[:, None, :], Z()[:, None, :], 6, 2, torch.eye(18, 6) * w[0, 0], None,
        None, None, False, 0.0, torch.eye(6), None)[0],
    'masked_softmax': lambda: F.softmax(NEG(), 1),
    'masked_log_softmax': lambda: F.log_softmax(NEG(), 1),
    'masked_max': lambda: NEG().max(1)[0].clamp_min(-1e4),
    'masked_ce': lambda: F.cross_entropy(NEG(), torch.tensor([1, 1, 1, 1])),
    'interp': lambda: F.interpolate(Z()[None, None], scale_factor=2, mode='bilinear'),
    'grid_sample': lambda: F.grid_sample(Z()[None, None], torch.zeros(1, 2, 2, 2), align_corners=False),
    'avg_pool': lambda: F.avg_pool1d(Z()[None], 2),
    'adaptive_max': lambda: F.adaptive_max_pool1d(Z()[None], 3),
    'embedding_bag': lambda: F.embedding_bag(torch.tensor([0, 1, 2]), Z(), torch.tensor([0, 2]), mode='mean'),
    'det': lambda: torch.linalg.det(Z()[:, :4]),
    'logdet': lambda: torch.logdet(Z()[:, :4] + torch.eye(4)),
    'slogdet': lambda: torch.linalg.slogdet(Z()[:, :4])[1],
    'inv': lambda: torch.linalg.inv(Z()[:, :4] + 10 * torch.eye(4)),
    'eigh': lambda: torch.linalg.eigh(Z()[:, :4] @ Z()[:, :4].t())[0],
    'eigh_vec': lambda: torch.linalg.eigh(torch.eye(4) * w[0, 0])[1],
    'svd': lambda: torch.linalg.svd(Z(), full_matrices=False)[0],
    'qr': lambda: torch.linalg.qr(Z())[0],
    'cholesky': lambda: torch.linalg.cholesky(Z()[:, :4] @ Z()[:, :4].t() + torch.eye(4)),
    'pinv': lambda: torch.linalg.pinv(Z()),
    'lstsq': lambda: torch.linalg.lstsq(Z()[:, :4], Z()[:, 4:]).solution,
    'renorm': lambda: torch.renorm(Z(), 2, 0, 1.0),
    'nan_to_num': lambda: torch.nan_to_num(Z().log()),
    'where_log': lambda: torch.where(Z() > 0, Z(), 1.0).log(),
    'glu': lambda: F.glu(Z(), 1),
    'weight_norm': lambda: torch._weight_norm(Z(), torch.ones(4, 1), 0),
    'trace': lambda: Z()[:, :4].trace(),
    'expm1': lambda: Z().expm1(),
    'log1p': lambda: Z().log1p(),
    'lgamma': lambda: torch.lgamma(Z() + 1),
    'digamma': lambda: torch.digamma(Z() + 1),
    'i0': lambda: torch.i0(Z()),
    'special_i1': lambda: torch.special.i1(Z()),
    'erfcx': lambda: torch.special.erfcx(Z()),
    'logit': lambda: torch.logit(Z().clamp(0, 1), eps=1e-6),
    'normal_lp': lambda: torch.distributions.Normal(Z(), Z().abs() + 1).log_prob(torch.zeros(4, 6)),
    'categorical_entropy': lambda: torch.distributions.Categorical(logits=NEG()[1:2]).entropy(),
    'gumbel': lambda: F.gumbel_softmax(Z(), tau=1.0),
    'dirichlet_lp': lambda: torch.distributions.Dirichlet(Z().abs() + 1).log_prob(torch.full((4, 6), 1 / 6)),
    'beta_lp': lambda: torch.distributions.Beta(Z().abs() + 1, Z().abs() + 1).log_prob(
        torch.full((4, 6), 0.5)),
    'mvn_lp': lambda: torch.distributions.MultivariateNormal(
        Z()[:, :2], scale_tril=torch.eye(2) * w[0, 0]).log_prob(torch.zeros(4, 2)),
}
only = sys.argv[1:]
for name, case in cases.items():
    if only and name not in only:
        continue
    try:
        y = case()
        loss = (y.real if y.is_complex() else y).float().sum()
        opt.zero_grad()
        loss.backward()
        loss_finite = bool(torch.isfinite(loss))
        grad_finite = bool(torch.isfinite(w.grad).all()) if w.grad is not None else None
    except Exception as e:  # an op that refuses its input: no case
        loss_finite, grad_finite = None, f"error {type(e).__name__}"
    opt.step()
    with torch.no_grad():
        w.fill_(1.0)
    print(f"CASE {name} loss_finite {loss_finite} grad_finite {grad_finite}", flush=True)
