"""A process that never trains (an evaluation or inference script) counts
its forward passes as steps: the overflow in batch 5 is named at step 5,
not at step 0 with every other batch. A process that trains after
evaluating keeps its training steps' numbers."""
import pytest

from conftest import NANHUNT, PYTHON, SCRIPTS, preload_run, run, view_json

SCRIPT = SCRIPTS / "evaluation_only.py"


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "grad", "attention"])
def test_each_forward_pass_of_an_evaluation_is_a_step(out, mode):
    r = preload_run([PYTHON, SCRIPT, mode], out)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run([PYTHON, SCRIPT, mode]).stdout, "monitoring changed a result"
    assert "batch 5 finite: False" in r.stdout and "batch 4 finite: True" in r.stdout
    j = view_json(out)
    first = j["first_origin"]
    assert (first["kind"], first["step"], first["phase"]) == ("origin", 5, "forward"), first
    assert first["source"].endswith("evaluation_only.py:68 in <module>"), first["source"]
    assert j["steps"] == 8 and j["forward_passes"], (j["steps"], j["forward_passes"])
    assert j["nonfinite_steps"] == [5], j["nonfinite_steps"]
    text = run([NANHUNT, "view", out]).stdout
    assert "1 trace, 8 forward passes, no training" in text, text[:200]
    assert "at step 5" in text


def test_evaluating_before_training_leaves_the_training_steps_numbered_as_before(out):
    r = preload_run([PYTHON, SCRIPT, "validate-then-train"], out)
    assert r.returncode == 0, r.stderr
    j = view_json(out)
    first = j["first_origin"]
    assert (first["step"], first["phase"]) == (2, "forward"), first
    assert j["steps"] == 3 and not j["forward_passes"], (j["steps"], j["forward_passes"])
    assert "forward passes" not in run([NANHUNT, "view", out]).stdout
