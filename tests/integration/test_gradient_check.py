"""The gradient check behind NANHUNT_SKIP_NONFINITE_STEPS and sample mode's
sentinel (step_guard.py): every NaN or inf in any floating dtype is found,
and finite gradients are never called non-finite, even where the fast
2-norm screen overflows (fp16 gradients whose norm passes 65504, fp32
values whose squares pass fp32's range)."""
import gc
import importlib.util
import weakref
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

GUARD = Path(__file__).resolve().parents[2] / "interpose" / "torch" / "step_guard.py"
_spec = importlib.util.spec_from_file_location("nanhunt_step_guard", GUARD)
guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guard)


def all_finite(*tensors):
    return guard._all_finite([(None, t) for t in tensors])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_every_non_finite_value_is_found(dtype, bad):
    t = torch.ones(1000, dtype=dtype)
    t[617] = bad
    assert not all_finite(torch.ones(10), t)


def test_the_sentinel_decides_host_gradients_at_once_like_the_skip_check():
    # Sample mode's path (_sentinel_later): on the CPU nothing is deferred.
    bad = torch.ones(1000, dtype=torch.float16)
    bad[3] = float("nan")
    good = torch.full((100000,), 300.0, dtype=torch.float16)
    assert guard._sentinel_later([(None, good), (None, torch.ones(3))]) is True
    assert guard._sentinel_later([(None, good), (None, bad)]) is False
    assert guard._late == []


def test_finite_gradients_whose_norm_would_overflow_are_finite():
    assert all_finite(torch.full((100000,), 300.0, dtype=torch.float16))  # norm 94868
    assert all_finite(torch.tensor([3e19, 1.0]))  # its square passes fp32's range
    assert all_finite(torch.full((1000,), 60000.0, dtype=torch.float16))


def test_sparse_gradients_are_checked_on_their_values():
    values = torch.tensor([1.0, float("nan")])
    sparse = torch.sparse_coo_tensor([[0, 5]], values, (10,), check_invariants=True)
    assert not all_finite(sparse)
    assert all_finite(torch.sparse_coo_tensor([[0, 5]], [1.0, 2.0], (10,),
                                              check_invariants=True))


class _FakeLibrary:
    """What step_guard.py calls in libnanhunt_torch.so, recorded."""

    def __init__(self, skip, fail_on_skip=False):
        self.calls = []
        self.skip = skip
        self.fail_on_skip = fail_on_skip

    def nanhunt_skip_enabled(self):
        return int(self.skip)

    def nanhunt_quiet(self, on):
        self.calls.append(("quiet", on))

    def nanhunt_sentinel(self, finite):
        self.calls.append(("sentinel", finite))

    def nanhunt_optimizer_stepping(self, identity, replaces_another):
        self.calls.append(("stepping", identity, replaces_another))

    def nanhunt_scaler_skipped_step(self, identity, replaces_another):
        self.calls.append(("scaler skipped", identity, replaces_another))

    def nanhunt_step_skipped(self):
        self.calls.append(("skipped",))
        if self.fail_on_skip:
            raise RuntimeError("planted")


@pytest.fixture
def fresh_guard(monkeypatch):
    monkeypatch.setattr(guard, "_broken", False)
    monkeypatch.setattr(guard, "_held", {})
    monkeypatch.setattr(guard, "_late", [])
    monkeypatch.setattr(guard, "_owners", {})
    monkeypatch.setattr(guard, "_claimed", weakref.WeakKeyDictionary())
    return guard


def test_gradscaler_skips_are_reported_for_optimizers_that_run_torchs_hooks(
        fresh_guard, monkeypatch):
    # GradScaler.step skips an optimizer by not calling its step(): the
    # wrapper tells that from no pre-hook having run. An optimizer class of
    # the program's own runs none when it steps: not a skip.
    lib = _FakeLibrary(skip=False)
    monkeypatch.setattr(fresh_guard, "_lib", lib)
    monkeypatch.setattr(fresh_guard, "_sentinel", False)
    monkeypatch.setattr(torch.amp.GradScaler, "step", torch.amp.GradScaler.step)  # restored
    fresh_guard._watch_grad_scaler()
    hook = register_optimizer_step_pre_hook(fresh_guard._before_step)

    class OwnOptimizer:  # no torch.optim.Optimizer: no hooks
        def __init__(self, params):
            self.param_groups = [{"params": params}]
            self.state = {}
            self.steps = 0

        def step(self):
            self.steps += 1

    try:
        for gradient, make in [(1.0, lambda p: torch.optim.SGD([p])),
                               (float("inf"), lambda p: torch.optim.SGD([p])),
                               (1.0, lambda p: OwnOptimizer([p]))]:
            p = torch.nn.Parameter(torch.ones(2))
            p.grad = torch.full((2,), gradient)
            opt = make(p)
            scaler = torch.amp.GradScaler("cpu")
            scaler.scale(torch.ones(()))  # sets its scale up, as a loss's would
            scaler.step(opt)
            if isinstance(opt, OwnOptimizer):
                assert opt.steps == 1
    finally:
        hook.remove()
    skips = [c for c in lib.calls if c[0] == "scaler skipped"]
    assert len(skips) == 1, lib.calls  # the SGD step on inf gradients


@pytest.mark.parametrize("first_kept", [True, False])
def test_an_optimizer_made_once_the_others_are_gone_replaces_them(
        fresh_guard, monkeypatch, first_kept):
    # A sweep or a cross-validation: the next model and its optimizer are
    # made where the last ones were, which are gone by its first step. Kept
    # (a GAN's discriminator), the other steps beside it.
    lib = _FakeLibrary(skip=False)
    monkeypatch.setattr(fresh_guard, "_lib", lib)
    monkeypatch.setattr(fresh_guard, "_sentinel", False)
    parameters = [torch.nn.Parameter(torch.ones(2)) for _ in range(2)]  # ids never reused
    first = torch.optim.SGD([parameters[0]])
    fresh_guard._before_step(first, (), {})
    if not first_kept:
        del first
        gc.collect()
    fresh_guard._before_step(torch.optim.SGD([parameters[1]]), (), {})
    named = [c[1:] for c in lib.calls if c[0] == "stepping"]
    assert named == [(id(parameters[0]), 0), (id(parameters[1]), int(not first_kept))], named


def test_each_optimizer_is_named_by_its_first_parameter_and_what_it_took_over(
        fresh_guard, monkeypatch):
    lib = _FakeLibrary(skip=False)
    monkeypatch.setattr(fresh_guard, "_lib", lib)
    monkeypatch.setattr(fresh_guard, "_sentinel", False)
    head, body = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    generator, discriminator = torch.optim.SGD([body]), torch.optim.SGD([head])
    head_only = discriminator
    everything = torch.optim.SGD([body, head])
    steps = [generator, discriminator, generator, discriminator,
             torch.optim.SGD([body]),  # made anew over the same parameters
             head_only, everything, everything]
    for opt in steps:
        assert fresh_guard._before_step(opt, (), {}) is None
    named = [c[1:] for c in lib.calls if c[0] == "stepping"]
    assert named == [(id(body), 0), (id(head), 0), (id(body), 0), (id(head), 0),
                     (id(body), 0), (id(head), 0),
                     # a fine-tuning's next phase: it took over the head's
                     # parameter, at its first step only
                     (id(body), 1), (id(body), 0)], named


def _optimizer_with_nan_gradient():
    w = torch.nn.Parameter(torch.ones(4))
    w.grad = torch.tensor([1.0, float("nan"), 2.0, 3.0])
    return w, torch.optim.SGD([w], lr=0.1)


@pytest.mark.parametrize("skip", [True, False])
def test_an_error_inside_the_guard_never_reaches_the_training_loop(
        fresh_guard, monkeypatch, capsys, skip):
    # A failing gradient check: reported once, the guard steps aside, and
    # the step goes on with the user's gradients untouched.
    monkeypatch.setattr(fresh_guard, "_lib", _FakeLibrary(skip))
    monkeypatch.setattr(fresh_guard, "_sentinel", not skip)

    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(torch, "_foreach_norm", broken)
    w, opt = _optimizer_with_nan_gradient()
    grad = w.grad
    for _ in range(2):
        assert fresh_guard._before_step(opt, (), {}) is None
        fresh_guard._after_step(opt, (), {})
        assert w.grad is grad
    err = capsys.readouterr().err
    assert err.count("nanhunt: internal error in the step guard (RuntimeError: planted)") == 1
    assert fresh_guard._broken


def test_gradients_held_back_come_back_when_the_guard_fails_midway(fresh_guard, monkeypatch):
    lib = _FakeLibrary(skip=True, fail_on_skip=True)
    monkeypatch.setattr(fresh_guard, "_lib", lib)
    monkeypatch.setattr(fresh_guard, "_sentinel", False)
    w, opt = _optimizer_with_nan_gradient()
    grad = w.grad
    assert fresh_guard._before_step(opt, (), {}) is None
    assert ("skipped",) in lib.calls
    assert w.grad is grad, "the step must not lose the user's gradients"
    assert fresh_guard._held == {}
