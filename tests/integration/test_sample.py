"""NANHUNT_MODE=sample: 1% of op calls checked, the gradients every step.
An overflow that recurs every five steps is missed or not the first time,
but the sentinel escalates to every-op checking, and the next occurrence is
caught at its origin op, with its line."""
import sqlite3

import pytest

from conftest import NANHUNT, PYTHON, SCRIPTS, findings, preload_run, run, view_json

SCRIPT = SCRIPTS / "recurring_overflow.py"
SAMPLE = dict(NANHUNT_MODE="sample", NANHUNT_SAMPLE_OPS="0.01", NANHUNT_SAMPLE_STEPS="0",
              NANHUNT_ESCALATE_STEPS="20", NANHUNT_SKIP_NONFINITE_STEPS="1")


def test_a_recurring_overflow_is_localised_within_the_escalation_window(out):
    r = preload_run([PYTHON, SCRIPT], out, **SAMPLE)
    assert r.returncode == 0, r.stderr
    [trace] = out.glob("*.sqlite")
    db = sqlite3.connect(trace)
    (escalation,) = db.execute(
        "SELECT detail FROM events WHERE kind = 'escalated' ORDER BY time").fetchone()
    assert escalation.startswith("gradients not finite (sentinel) at step 5"), escalation
    report = view_json(out)
    first = report["first_origin"]
    assert first["kind"] == "origin" and first["op"] == "aten::addmm", first
    assert 5 <= first["step"] <= 25, first  # the next burst, inside the window
    assert "recurring_overflow.py:18" in first["source"]
    # Before the first burst, a sample; once escalated, everything.
    (before,) = db.execute("SELECT SUM(calls) FROM op_stats WHERE step < 5").fetchone()
    (after,) = db.execute("SELECT SUM(calls) FROM op_stats WHERE step = 6").fetchone()
    assert (before or 0) * 10 < after, (before, after)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    # Between escalations torch sampled the op calls (the unsampled ones
    # never reached nanhunt, so there is no count of them).
    assert meta["op_sampling"] == "torch" and "op_calls_seen" not in meta, meta
    assert int(meta["op_calls_checked"]) > 0
    # The view lists each escalation with what its window caught.
    [window] = report["sample_mode"]["escalations"]
    assert (window["step"], window["until_step"]) == (5, 25), window
    assert window["found"] == {"kind": "origin", "op": "aten::addmm", "phase": "forward",
                               "step": first["step"]}, window
    text = run([NANHUNT, "view", str(out)]).stdout
    assert "SAMPLE MODE  op calls sampled by torch" in text, text
    assert "found: origin aten::addmm" in text, text


def test_sampling_is_the_same_in_two_runs(tmp_path):
    counts = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        r = preload_run([PYTHON, SCRIPT], out, **SAMPLE)
        assert r.returncode == 0, r.stderr
        [trace] = out.glob("*.sqlite")
        counts.append(sqlite3.connect(trace).execute(
            "SELECT step, op, phase, calls FROM op_stats ORDER BY 1, 2, 3").fetchall())
    assert counts[0] == counts[1]


def test_a_budget_lowers_the_share_of_ops_checked(out):
    # Checking every op of this small model costs far more than 1% of its
    # step: the budget must bring the share down, and say so in the trace.
    r = preload_run([PYTHON, SCRIPTS / "long_small_training.py"], out, timeout=900,
                    NANHUNT_MODE="sample", NANHUNT_SAMPLE_OPS="1", NANHUNT_SAMPLE_STEPS="0",
                    NANHUNT_BUDGET="1%")
    assert r.returncode == 0, r.stderr
    [trace] = out.glob("*.sqlite")
    db = sqlite3.connect(trace)
    changes = [d for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'sample_rate'")]
    assert changes and "checks took" in changes[0], changes[:3]
    (final,) = db.execute("SELECT value FROM meta WHERE key = 'sample_ops_final'").fetchone()
    assert float(final) < 0.5, final


def test_steps_gradscaler_skipped_are_counted_and_escalate(out):
    # A skipped iteration has no optimizer record, and while torch samples
    # op calls the scale update is not seen either: the step must still end
    # there, and a skip is a non-finite sign to escalate on. Backward ops sit
    # near fp16's limit every step under GradScaler: only an op's first
    # warning escalates, or sample mode would never sample.
    r = preload_run([PYTHON, SCRIPTS / "gradscaler_training.py"], out,
                    NANHUNT_MODE="sample", NANHUNT_SAMPLE_OPS="0.01",
                    NANHUNT_SAMPLE_STEPS="0", NANHUNT_ESCALATE_STEPS="1")
    assert r.returncode == 0, r.stderr
    [trace] = out.glob("*.sqlite")
    db = sqlite3.connect(trace)
    escalations = [d for (d,) in db.execute(
        "SELECT detail FROM events WHERE kind = 'escalated' ORDER BY rowid")]
    # Step 0 skips, step 1 warns for the first time, step 2's planted inf
    # and skip fall in the open window; step 5's skip comes in a sampled step.
    assert [e.split(": ")[0] for e in escalations] == [
        f"GradScaler skipped the optimizer step (gradients not finite) at step {s}"
        for s in (0, 5)], escalations
    calls = dict(db.execute("SELECT step, SUM(calls) FROM op_stats GROUP BY step"))
    assert calls.get(4, 0) * 10 < calls[3], calls  # step 4 was sampled
    report = view_json(out)
    assert report["steps"] == 8
    assert dict(db.execute("SELECT key, value FROM meta"))["op_sampling"] == "torch"


def test_the_seed_decides_which_calls_torch_samples(tmp_path):
    # Steps 1-4 run before the first escalation, with torch sampling the op
    # calls from the reseeded generator: the same seed picks the same calls,
    # another seed others.
    def sampled(seed, run):
        out = tmp_path / f"seed{seed}-{run}"
        r = preload_run([PYTHON, SCRIPT], out, **{**SAMPLE, "NANHUNT_SAMPLE_OPS": "0.2",
                                                  "NANHUNT_SAMPLE_SEED": str(seed)})
        assert r.returncode == 0, r.stderr
        [trace] = out.glob("*.sqlite")
        db = sqlite3.connect(trace)
        assert dict(db.execute("SELECT key, value FROM meta"))["op_sampling"] == "torch"
        return db.execute("SELECT step, op, phase, calls FROM op_stats "
                          "WHERE step BETWEEN 1 AND 4 ORDER BY 1, 2, 3").fetchall()
    first = sampled(0, 0)
    assert first, "nothing sampled in steps 1-4"
    assert sampled(0, 1) == first
    assert sampled(7, 0) != first


def test_a_mask_whose_maker_went_unsampled_is_no_finding_and_no_escalation(out):
    # Half the op calls are checked: a sampled op is handed a -inf mask that
    # an unsampled full/masked_fill made. Called "non-finite data" before,
    # which escalated sample mode to every op for 20 steps, again and again
    # in any model with an additive attention mask.
    r = preload_run([PYTHON, SCRIPTS / "masked_attention.py"], out, NANHUNT_MODE="sample",
                    NANHUNT_SAMPLE_OPS="0.5", NANHUNT_SAMPLE_STEPS="0")
    assert r.returncode == 0, r.stderr
    [trace] = out.glob("*.sqlite")
    db = sqlite3.connect(trace)
    assert db.execute("SELECT detail FROM events WHERE kind = 'escalated'").fetchall() == []
    nonfinite = [f for f in findings(out) if f["kind"] not in ("near_max", "underflow")]
    assert nonfinite == [], nonfinite
    assert int(dict(db.execute("SELECT key, value FROM meta"))["op_calls_checked"]) > 0


@pytest.mark.parametrize("layout", ["two-optimizers", "in-backward", "gradscaler", "recreated",
                                    "gan", "gan-gradscaler", "next-phase"])
def test_several_optimizers_an_iteration_are_one_step_in_sample_mode(out, layout):
    # Sample mode sees no forward pass: each optimizer record ended a step,
    # so two optimizers an iteration (or one per parameter, stepped in
    # backward; or two that GradScaler skipped; a GAN's) read 8 steps for
    # the program's 4, and iteration 2's overflow as step 4. The optimizer
    # that steps next, named by the step guard, tells the iteration's; one
    # made anew each iteration (recreated) is still one step an iteration,
    # and so is a new one that takes over the parameters of the one before
    # (next-phase, which would otherwise read 3 steps and step 1).
    cmd = [PYTHON, SCRIPTS / "several_optimizers.py", layout, "forward"]
    r = preload_run(cmd, out, NANHUNT_MODE="sample", NANHUNT_SAMPLE_OPS="0.01",
                    NANHUNT_SAMPLE_STEPS="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == run(cmd).stdout, "monitoring changed a result"
    j = view_json(out)
    assert j["steps"] == 4, j["steps"]
    assert j["nonfinite_steps"][0] == 2, j["nonfinite_steps"]
    assert j["first_origin"]["step"] == 2, j["first_origin"]
    [trace] = out.glob("*.sqlite")
    escalations = [d for (d,) in sqlite3.connect(trace).execute(
        "SELECT detail FROM events WHERE kind = 'escalated' ORDER BY rowid")]
    assert escalations and " at step 2" in escalations[0], escalations
    if layout in ("gradscaler", "gan-gradscaler"):
        assert j["skipped_steps"] == [2], j["skipped_steps"]
    if layout == "gradscaler":
        # The first inf sample mode saw went into GradScaler's unscale (the
        # update, though no backward op was sampled before it), made by the
        # unsampled backward pass: not "came in with the data", and its line
        # is the program's scaler.step, not nanhunt's wrapper.
        first = j["first_origin"]
        assert (first["kind"], first["phase"]) == ("input", "optimizer"), first
        assert j["diagnosis"]["kind"] == "unchecked_maker", j["diagnosis"]
        assert first["source"].startswith(str(SCRIPTS / "several_optimizers.py")), first
