"""Ops on a second thread while the main thread trains: an EMA of the
weights kept by a helper thread (tests/integration/scripts/ema_thread.py),
whose ops run between and during the training's."""
from conftest import PYTHON, SCRIPTS, clean_env, findings, preload_run, run, view_json


def losses(stdout):
    return [line for line in stdout.splitlines() if line.startswith("step ")]


def test_a_helper_threads_ops_leave_steps_origin_and_training_alone(out):
    script = SCRIPTS / "ema_thread.py"
    plain = run([PYTHON, script], env=clean_env())
    assert plain.returncode == 0, plain.stderr
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr, r.stderr
    # The helper ran alongside (thousands of EMA updates over 12 steps).
    updates = int(r.stdout.split("ema updates")[1])
    assert updates > 12, r.stdout
    # Training computed the same numbers, bit for bit.
    assert losses(r.stdout) == losses(plain.stdout)
    assert len(losses(plain.stdout)) == 12
    j = view_json(out)
    assert j["steps"] == 12, j["steps"]
    first = j["first_origin"]
    # Iteration 5's input is scaled by 3000: its weight gradient overflows.
    assert (first["kind"], first["op"], first["phase"], first["step"]) == (
        "origin", "aten::mm", "backward", 5), first
    assert first["forward_op"] == "aten::addmm", first
    assert j["nonfinite_steps"][0] == 5, j["nonfinite_steps"]
    # The helper's ops were observed on their own thread: its lerp_ carried
    # the inf/NaN the update wrote into the weights.
    helper = [f for f in findings(out) if f["op"] == "aten::lerp_"]
    assert helper, "no finding on the helper thread"
    assert {f["thread"] for f in helper} != {first_thread(out)}


def first_thread(out):
    return next(f["thread"] for f in findings(out, "origin"))
