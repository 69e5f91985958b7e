"""`nanhunt view` classifies a run the way an expert would. Each class is
shown by a real training script built to show it, run under the preload;
the test checks the class, the op it names and that a fix is offered."""
import pytest

from conftest import DEMO, NANHUNT, PYTHON, SCRIPTS, preload_run, run, view_json

CASES = [
    # script, class, op named
    (DEMO, "forward_overflow", "aten::matmul"),
    (SCRIPTS / "backward_overflow.py", "backward_overflow", None),
    (SCRIPTS / "nan_in_batch.py", "nonfinite_input", None),
    (SCRIPTS / "oscillating_scaler.py", "skipped_steps", None),
    (SCRIPTS / "vanishing_gradients.py", "underflow", ""),
    (SCRIPTS / "healthy_training.py", "healthy", ""),
]


@pytest.mark.parametrize("script,kind,op", CASES, ids=[c[1] for c in CASES])
def test_each_class_from_a_script_that_shows_it(script, kind, op, out):
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    d = view_json(out)["diagnosis"]
    assert d["kind"] == kind, d
    if op is not None:
        assert d["op"] == op, d
    assert d["title"] and d["evidence"], d
    if kind != "healthy":
        assert d["fixes"], d
    text = run([NANHUNT, "view", out]).stdout
    assert f"DIAGNOSIS  {d['title'][:40]}" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_forward_overflow_names_the_fixes_an_expert_would_try(out):
    r = preload_run([PYTHON, DEMO], out)
    assert r.returncode == 0, r.stderr
    d = view_json(out)["diagnosis"]
    assert d["title"] == "Forward overflow: aten::matmul produced values past fp16's 65504 at step 26"
    assert any("demo/train.py:30" in e for e in d["evidence"]), d["evidence"]
    assert any("warned about from step 13" in e for e in d["evidence"]), d["evidence"]
    fixes = " ".join(d["fixes"])
    assert "NANHUNT_FP32_OPS=aten::matmul" in fixes
    assert "scale before the matmul" in fixes
    assert "bf16" in fixes


def test_a_nan_in_the_data_blames_the_data_not_an_op(out):
    r = preload_run([PYTHON, SCRIPTS / "nan_in_batch.py"], out)
    assert r.returncode == 0, r.stderr
    d = view_json(out)["diagnosis"]
    assert d["title"] == "Non-finite values came in with the data, not from an op"
    assert any("the batch of step 2" in f for f in d["fixes"]), d["fixes"]
