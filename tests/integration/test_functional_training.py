"""A torch.func training loop (functional_call under grad, a hand-written
update): no torch.optim record and no .grad, only wrapper tensors at the
top of each op. Its iterations must still be steps, and its first NaN at
the iteration that made it."""
from conftest import PYTHON, SCRIPTS, plain_and_monitored, view_json


def test_each_grad_call_is_a_step_and_the_origin_is_at_its_iteration(out):
    monitored, _ = plain_and_monitored([PYTHON, SCRIPTS / "functional_training.py"], out)
    assert "step 3 loss nan" in monitored.stdout, monitored.stdout
    j = view_json(out)
    # Before: one step, 0, for the whole run (the wrappers' ops never told
    # the step tracker a backward pass had run), then four once they did
    # (the NaN parameters read as gradients kept for a micro-batch).
    assert j["steps"] == 6, j["steps"]
    assert j["nonfinite_steps"] == [3, 4, 5], j["nonfinite_steps"]
    first = j["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == ("aten::pow", "forward", 3), first
    assert first["source"].endswith("functional_training.py:17 in loss_fn"), first["source"]
    # Its input, the difference the exploded batch made. Before: the
    # wrapper grad() passed at the top, "#0 float32[16, 1] (not checked)",
    # and the value as "#2" (a boxed call records its whole stack, where
    # torch.func leaves the wrapped arguments beneath the unwrapped ones).
    assert first["inputs"] == "#0 float32[16, 1] max|x|=3.39483e+29", first["inputs"]
    d = j["diagnosis"]
    assert d["kind"] == "invalid_math", d
    # The batch exploded, not the gradients: clipping is not the first fix.
    assert d["fixes"][0].startswith("find where the values grew"), d["fixes"]
