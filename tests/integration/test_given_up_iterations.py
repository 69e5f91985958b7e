"""A training loop that gives an iteration up on a non-finite loss
(`if not torch.isfinite(loss): continue`) has that iteration as a step of
its own: step numbers keep counting the program's iterations, and the view
says which ones it gave up. Two forward passes into one loss, and a layer
applied twice in a pass, stay one step although they read the first layer's
weights again after inf."""
import pytest

from conftest import NANHUNT, PYTHON, SCRIPTS, preload_run, run, view_json

SCRIPT = SCRIPTS / "skip_nonfinite_loss.py"


def test_an_iteration_given_up_on_a_nonfinite_loss_is_a_step_of_its_own(out):
    r = preload_run([PYTHON, SCRIPT, "continue"], out)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run([PYTHON, SCRIPT, "continue"]).stdout, "monitoring changed a result"
    assert "iteration 4 loss nan" in r.stdout and "iteration 5 loss nan" not in r.stdout
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["step"], first["phase"]) == ("aten::addmm", 3, "forward"), first
    assert j["steps"] == 10, j["steps"]
    assert j["nonfinite_steps"] == [3, 4], j["nonfinite_steps"]
    assert j["given_up_steps"] == [3, 4], j["given_up_steps"]
    text = run([NANHUNT, "view", out]).stdout
    assert "ITERATIONS GIVEN UP" in text and "2 of 10 steps: 3-4" in text, text
    assert "Forward overflow" in text and "gave up 2 iterations on a non-finite loss" in text, text
    assert "...ss....." in text, text


@pytest.mark.parametrize("mode", ["two-views", "rnn"])
def test_passes_of_one_iteration_are_one_step_after_inf(out, mode):
    r = preload_run([PYTHON, SCRIPT, mode], out)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run([PYTHON, SCRIPT, mode]).stdout, "monitoring changed a result"
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["step"], first["phase"]) == ("aten::addmm", 3, "forward"), first
    assert j["steps"] == 10, j["steps"]
    assert j["nonfinite_steps"] == list(range(3, 10)), j["nonfinite_steps"]
    assert j["given_up_steps"] == [], j["given_up_steps"]
    assert "GIVEN UP" not in run([NANHUNT, "view", out]).stdout
