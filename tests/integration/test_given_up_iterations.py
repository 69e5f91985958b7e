"""A training loop that gives an iteration up on a non-finite loss
(`if not torch.isfinite(loss): continue`) has that iteration as a step of
its own: step numbers keep counting the program's iterations, and the view
says which ones it gave up. Two forward passes into one loss, and a layer
applied twice in a pass, stay one step although they read the first layer's
weights again after inf. The same holds for iterations given up before the
first backward pass, which nanhunt sees as forward passes until the
process trains."""
import pytest

from conftest import NANHUNT, PYTHON, SCRIPTS, preload_run, run, view_json

SCRIPT = SCRIPTS / "skip_nonfinite_loss.py"


@pytest.mark.parametrize("batches", ["later", "first"])
def test_an_iteration_given_up_on_a_nonfinite_loss_is_a_step_of_its_own(out, batches):
    # later: batches 3 and 4 overflow; first: batches 0 and 1, before any
    # backward pass, when nanhunt still counts forward passes (an
    # evaluation's) until the process trains.
    cmd = [PYTHON, SCRIPT, "continue"] + (["first"] if batches == "first" else [])
    given_up = [0, 1] if batches == "first" else [3, 4]
    r = preload_run(cmd, out)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run(cmd).stdout, "monitoring changed a result"
    assert f"iteration {given_up[1]} loss nan" in r.stdout, r.stdout
    assert f"iteration {given_up[1] + 1} loss nan" not in r.stdout, r.stdout
    assert "the program gave up 2 iterations on a non-finite loss" in r.stderr, r.stderr
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["step"], first["phase"]) == ("aten::addmm", given_up[0],
                                                            "forward"), first
    assert j["steps"] == 10, j["steps"]
    assert j["nonfinite_steps"] == given_up, j["nonfinite_steps"]
    assert j["given_up_steps"] == given_up, j["given_up_steps"]
    text = run([NANHUNT, "view", out]).stdout
    assert "ITERATIONS GIVEN UP" in text, text
    assert f"2 of 10 steps: {given_up[0]}-{given_up[1]}" in text, text
    assert "Forward overflow" in text and "gave up 2 iterations on a non-finite loss" in text, text
    strip = "".join("s" if step in given_up else "." for step in range(10))
    assert strip in text, text


def test_iterations_given_up_are_diagnosed_though_gradscaler_handled_the_rest(out):
    # fp16 autocast with a GradScaler, whose first updates overflow while
    # its scale settles (skipped, healthy); iterations 3 and 4 overflow in
    # the forward pass and are given up: they are what the diagnosis names.
    r = preload_run([PYTHON, SCRIPT, "gradscaler"], out)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run([PYTHON, SCRIPT, "gradscaler"]).stdout, "monitoring changed a result"
    j = view_json(out)
    assert j["steps"] == 10 and j["given_up_steps"] == [3, 4], (j["steps"], j["given_up_steps"])
    assert j["skipped_steps"] and 3 not in j["skipped_steps"], j["skipped_steps"]
    d = j["diagnosis"]
    assert d["kind"] == "forward_overflow" and "at step 3" in d["title"], d
    assert any(e.startswith("the program gave up 2 iterations") for e in d["evidence"]), d


@pytest.mark.parametrize("mode", ["two-views", "rnn"])
@pytest.mark.parametrize("batches", ["later", "first"])
def test_passes_of_one_iteration_are_one_step_after_inf(out, mode, batches):
    cmd = [PYTHON, SCRIPT, mode] + (["first"] if batches == "first" else [])
    r = preload_run(cmd, out)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run(cmd).stdout, "monitoring changed a result"
    bad = 0 if batches == "first" else 3
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["step"], first["phase"]) == ("aten::addmm", bad, "forward"), first
    assert j["steps"] == 10, j["steps"]
    assert j["nonfinite_steps"] == list(range(bad, 10)), j["nonfinite_steps"]
    assert j["given_up_steps"] == [], j["given_up_steps"]
    assert "GIVEN UP" not in run([NANHUNT, "view", out]).stdout
