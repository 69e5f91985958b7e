"""The gradient check behind NANHUNT_SKIP_NONFINITE_STEPS and sample mode's
sentinel (step_guard.py): every NaN or inf in any floating dtype is found,
and finite gradients are never called non-finite, even where the fast
2-norm screen overflows (fp16 gradients whose norm passes 65504, fp32
values whose squares pass fp32's range)."""
import importlib.util
from pathlib import Path

import pytest
import torch

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
