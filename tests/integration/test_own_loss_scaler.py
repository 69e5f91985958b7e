"""A program with a dynamic loss scaler of its own (fairseq's and Megatron's
FP16 optimizers, DeepSpeed's fp16 engine) skips each update whose gradients
overflowed without torch.amp.GradScaler: nanhunt tells those skips from
gradients that reached the weights, and numbers the steps as the program
does. Before, such a run was diagnosed 'NaN mid-training: gradients
overflowed ... use loss scaling with skipping', and each skipped iteration
merged into the next step."""
import sqlite3

import pytest

from conftest import NANHUNT, PYTHON, SCRIPTS, clean_env, preload_run, run, view_json

SCRIPT = SCRIPTS / "own_loss_scaler.py"


def skipped_by_the_script(stdout):
    return [int(line.split()[0]) for line in stdout.splitlines() if " skip " in line]


def monitored(mode, out):
    r = preload_run([PYTHON, SCRIPT, mode], out)
    assert r.returncode == 0, r.stderr
    plain = run([PYTHON, SCRIPT, mode], env=clean_env())
    assert plain.returncode == 0, plain.stderr
    assert r.stdout == plain.stdout, "monitoring changed the training"
    return r


@pytest.mark.parametrize("mode", ["set-to-none", "in-place", "accumulate"])
def test_skips_are_the_programs_and_the_run_is_healthy(out, mode):
    r = monitored(mode, out)
    skipped = skipped_by_the_script(r.stdout)
    # Its scale starts at 2**24: the first updates are skipped while it
    # settles, then one in five as it grows the scale again.
    assert skipped[:7] == list(range(7)) and len(skipped) in (11, 12), skipped
    j = view_json(out)
    assert j["steps"] == 30  # one per iteration, micro-batches or not
    assert j["program_skipped_steps"] == skipped
    assert j["skipped_steps"] == []  # no GradScaler
    d = j["diagnosis"]
    assert d["kind"] == "healthy", d
    assert d["title"] == \
        "Healthy: every inf/NaN was in gradients the program's loss scaler skipped"
    assert any(e.startswith(f"the program skipped {len(skipped)} of 30 updates")
               for e in d["evidence"]), d
    [trace] = out.glob("*.sqlite")
    details = [detail for (detail,) in sqlite3.connect(trace).execute(
        "SELECT detail FROM events WHERE kind = 'program_skipped_update' ORDER BY rowid")]
    assert [int(d.split(":")[0].removeprefix("step ")) for d in details] == skipped
    # The backward of the fp32 loss's cast to fp16 is where they overflow.
    assert details[0].endswith("first non-finite gradients came from aten::to "
                               "(backward of aten::_to_copy)"), details[0]
    assert (f"nanhunt: the program skipped {len(skipped)} updates after non-finite "
            "gradients (a loss scaler of its own), without an optimizer step") in r.stderr
    view = run([NANHUNT, "view", out]).stdout
    assert f"{len(skipped)} of 30 updates skipped" in view, view


def test_a_run_that_stops_after_an_overflow_is_still_healthy(out):
    # Iteration 26 overflows and the run ends there, before the program
    # went on to skip it: no verdict on its gradients, not NaN that reached
    # the weights.
    r = preload_run([PYTHON, SCRIPT, "set-to-none", "27"], out)
    assert r.returncode == 0, r.stderr
    skipped = skipped_by_the_script(r.stdout)
    assert skipped[-1] == 26, skipped
    j = view_json(out)
    assert j["steps"] == 27
    assert j["program_skipped_steps"] == skipped[:-1]
    assert j["diagnosis"]["kind"] == "healthy", j["diagnosis"]
    [trace] = out.glob("*.sqlite")
    assert sqlite3.connect(trace).execute(
        "SELECT detail FROM events WHERE kind = 'unfinished_step'").fetchall() == [
            ("step 26: the process ended in this step, before an optimizer step or a "
             "loss scaler's skip ended it",)]


def test_a_scaler_that_skips_half_the_updates_stalls_training(out):
    r = monitored("stalled", out)
    skipped = skipped_by_the_script(r.stdout)
    j = view_json(out)
    assert j["program_skipped_steps"] == skipped
    d = j["diagnosis"]
    assert d["kind"] == "skipped_steps", d
    assert d["title"] == "Stalled training: the program's loss scaler skipped 60% of the steps"


def test_gradients_that_reach_the_weights_are_no_skip(out):
    # The same scaled loss without an overflow check: inf/NaN gradients go
    # into Adam and the weights.
    monitored("no-check", out)
    j = view_json(out)
    assert j["program_skipped_steps"] == []
    assert j["steps"] == 30
    assert j["diagnosis"]["kind"] == "backward_overflow", j["diagnosis"]


@pytest.mark.parametrize("mode", ["set-to-none", "no-check"])
def test_sample_mode_says_it_does_not_follow_the_programs_skips(out, mode):
    # Sample mode cannot tell a skip from accumulation (an op nobody checked
    # may hold the gradients): it counts the iterations whose non-finite
    # gradients were followed by the next batch without an optimizer step,
    # and the diagnosis says what that means and to check every op. A run
    # whose overflows reach the weights (no check: an optimizer step each
    # iteration) gets no such caution.
    r = preload_run([PYTHON, SCRIPT, mode], out, NANHUNT_MODE="sample")
    assert r.returncode == 0, r.stderr
    j = view_json(out)
    d = j["diagnosis"]
    unjudged = j["sample_mode"]["iterations_unjudged"]
    caution = [e for e in d["evidence"] if e.startswith("sample mode: ")]
    if mode == "no-check":
        assert unjudged == 0 and caution == [], d
        assert "began the next batch without an optimizer step" not in r.stderr, r.stderr
        return
    assert (f"nanhunt: sample mode: {unjudged} iterations made non-finite gradients and began the next batch "
            "without an optimizer step; if the program scales its loss itself (not GradScaler), "
            "NANHUNT_MODE=check follows its skips") in r.stderr, r.stderr
    assert d["kind"] == "backward_overflow", d
    assert unjudged > 0, j["sample_mode"]
    assert caution == [
        f"sample mode: {unjudged} times, non-finite gradients were followed by the next batch "
        "without an optimizer step. That is what a loss scaler of the program's own does when "
        "it skips an update (fairseq's and Megatron's FP16 optimizers, DeepSpeed's fp16 "
        "engine), and sample mode does not follow such skips: the overflows it threw away "
        "count as findings here"], d
    assert d["fixes"][0].startswith(
        "if the program scales its loss itself, run with every op checked (NANHUNT_MODE=check"), d
