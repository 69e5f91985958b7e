"""NANHUNT_SKIP_NONFINITE_STEPS: an update whose gradients are not finite
does not happen, for each torch.optim form, bit for bit; other updates are
bit-identical to a run without nanhunt; GradScaler keeps deciding alone."""
import sqlite3

import torch

from conftest import NANHUNT, PYTHON, SCRIPTS, clean_env, preload_run, run, view_json

SCRIPT = SCRIPTS / "planted_bad_gradients.py"
PLANTED, STEPS = {3, 4, 7}, 10


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.numpy().tobytes() == b.numpy().tobytes()


def same_snapshot(a, b):
    if a["params"].keys() != b["params"].keys() or a["state"].keys() != b["state"].keys():
        return False
    if not all(same_bits(a["params"][k], b["params"][k]) for k in a["params"]):
        return False
    for index, state in a["state"].items():
        other = b["state"][index]
        if state.keys() != other.keys():
            return False
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                if not same_bits(value, other[key]):
                    return False
            elif value != other[key]:
                return False
    return True


def test_skipped_updates_leave_parameters_and_state_bit_identical(out, tmp_path):
    ref_path, skip_path = tmp_path / "reference.pt", tmp_path / "skipped.pt"
    ref = run([PYTHON, SCRIPT, ref_path], env=clean_env(REFERENCE="1"))
    assert ref.returncode == 0, ref.stderr
    r = preload_run([PYTHON, SCRIPT, skip_path], out, NANHUNT_SKIP_NONFINITE_STEPS="1")
    assert r.returncode == 0, r.stderr
    reference, skipped = torch.load(ref_path), torch.load(skip_path)
    assert len(skipped) == 12  # 4 optimizers x for-loop, foreach, fused
    for form, states in skipped.items():
        for i, (a, b) in enumerate(zip(states, reference[form])):
            assert same_snapshot(a, b), f"{form}: state after step {i - 1} differs"
        for step in PLANTED:  # states[step + 1] is the state after `step`
            assert same_snapshot(states[step + 1], states[step]), (form, step)
        assert not same_snapshot(states[STEPS], states[STEPS - 1]), form
    [trace] = out.glob("*.sqlite")
    rows = sqlite3.connect(trace).execute(
        "SELECT step, first_op, forward_op FROM skipped_steps ORDER BY step").fetchall()
    expected = sorted(f * STEPS + s for f in range(12) for s in PLANTED)
    assert [row[0] for row in rows] == expected
    # The first non-finite gradient came from the planted multiply's backward.
    assert {(row[1], row[2]) for row in rows} == {("aten::mul", "aten::mul")}, rows
    assert "skipped the optimizer step at step 3: non-finite gradients, first " \
        "made by aten::mul (backward of aten::mul)" in r.stderr
    summary = view_json(out)["interventions"]["skipped_steps"]
    assert [k["step"] for k in summary] == expected
    text = run([NANHUNT, "view", out]).stdout
    assert "optimizer steps skipped for non-finite gradients: 36" in text
    assert "gradients first non-finite in: aten::mul (backward of aten::mul) x36" in text


def test_without_skipping_the_planted_gradients_do_ruin_the_parameters(tmp_path):
    # The harm the switch prevents (and proof the plant works).
    path = tmp_path / "planted.pt"
    r = run([PYTHON, SCRIPT, path])
    assert r.returncode == 0, r.stderr
    for form, states in torch.load(path).items():
        params = states[min(PLANTED) + 1]["params"]
        assert not all(torch.isfinite(p).all() for p in params.values()), form


def test_a_gradscaler_script_keeps_its_own_decisions(out):
    r = preload_run([PYTHON, SCRIPTS / "gradscaler_training.py"], out,
                    NANHUNT_SKIP_NONFINITE_STEPS="1")
    assert r.returncode == 0, r.stderr
    printed = [int(line.split()[5]) for line in r.stdout.splitlines()]
    assert printed == [1, 0, 1, 0, 0, 1, 0, 0]
    [trace] = out.glob("*.sqlite")
    db = sqlite3.connect(trace)
    assert db.execute("SELECT count(*) FROM skipped_steps").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM loss_scale WHERE skipped = 1").fetchone() == (3,)
