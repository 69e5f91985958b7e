"""NANHUNT_SKIP_NONFINITE_STEPS: an optimizer step whose gradients are not
all finite does not update anything, the way GradScaler skips a step.
NANHUNT_MODE=sample: the same gradient check is the sentinel that tells
nanhunt to check every op for a while.

Loaded by libnanhunt_torch.so into the monitored process at its first
optimizer step. torch.optim's optimizers skip every parameter whose .grad is
None (their state too: no step counter moves, no moment decays), so for a bad
step the gradients are held back during the update and given back after it:
parameters and optimizer state stay bit-identical, and the user's code still
finds its gradients (for logging, zero_grad) where they were.

Under DDP the gradients are all-reduced before the step, so every rank sees
the same values and takes the same decision.
"""
import ctypes
import sys

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

_lib = None
_skip = False
_sentinel = False
_held = {}  # id(optimizer) -> [(parameter, gradient)] held back this step


def _gradients(optimizer):
    return [
        (p, p.grad)
        for group in optimizer.param_groups
        for p in group["params"]
        if p.grad is not None
    ]


def _all_finite(grads):
    # One max-norm per gradient (a NaN or inf survives the max), computed
    # per device and dtype in one foreach call, and one host read per
    # device: the read waits for the backward pass, as GradScaler's does.
    groups = {}
    for _, g in grads:
        values = g.coalesce().values() if g.is_sparse else g
        groups.setdefault((values.device, values.dtype), []).append(values)
    with torch.no_grad():
        for tensors in groups.values():
            norms = torch._foreach_norm(tensors, float("inf"))
            if not bool(torch.stack(norms).isfinite().all()):
                return False
    return True


def _before_step(optimizer, args, kwargs):
    # A GradScaler hands fused optimizers its own found_inf and decides;
    # for the others it does not call step() at all on a bad step.
    if "found_inf" in kwargs or "grad_scale" in kwargs:
        return None
    grads = _gradients(optimizer)
    if not grads:
        return None
    _lib.nanhunt_quiet(1)  # these checks are nanhunt's, not the model's ops
    try:
        finite = _all_finite(grads)
    finally:
        _lib.nanhunt_quiet(0)
    if _sentinel:
        _lib.nanhunt_sentinel(int(finite))
    if finite or not _skip:
        return None
    _lib.nanhunt_step_skipped()
    for p, _ in grads:
        p.grad = None
    _held[id(optimizer)] = grads
    return None


def _after_step(optimizer, args, kwargs):
    for p, g in _held.pop(id(optimizer), ()):
        p.grad = g


def install(library_path, skip, sentinel):
    global _lib, _skip, _sentinel
    _lib = ctypes.CDLL(library_path)
    _lib.nanhunt_quiet.argtypes = [ctypes.c_int]
    _lib.nanhunt_sentinel.argtypes = [ctypes.c_int]
    _skip, _sentinel = skip == "1", sentinel == "1"
    register_optimizer_step_pre_hook(_before_step)
    register_optimizer_step_post_hook(_after_step)
