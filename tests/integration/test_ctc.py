"""CTC's loss (speech, handwriting): its forward variables hold -inf and
unwritten memory in every healthy step, which is no finding; its loss is
+inf for a transcript its audio is too short for, which is, with the
lengths that say why."""
from conftest import PYTHON, SCRIPTS, findings, plain_and_monitored, preload_run, view_json

SCRIPT = SCRIPTS / "ctc_training.py"


def test_healthy_ctc_training_has_no_finding(out):
    # Before: aten::_ctc_loss was an origin in every step, from log_alpha's
    # log(0) entries, and its unwritten part (1e37 garbage) came near fp16's limit.
    plain_and_monitored([PYTHON, SCRIPT, "healthy"], out)
    j = view_json(out)
    assert j["first_origin"] is None and j["nonfinite_steps"] == [], j["first_origin"]
    assert j["diagnosis"]["kind"] == "healthy", j["diagnosis"]
    assert not [f for f in findings(out) if f["op"] == "aten::_ctc_loss"]
    row = next(o for o in j["ops"] if o["op"] == "aten::_ctc_loss")
    assert row["max_abs"] < 100 and row["near_max"] == 0, row  # the loss, not the workspace


def test_a_transcript_longer_than_its_audio_is_the_origin_with_its_lengths(out):
    r = preload_run([PYTHON, SCRIPT, "impossible"], out)
    assert r.returncode == 0, r.stderr
    assert "step 3 loss inf" in r.stdout  # the run does go wrong
    j = view_json(out)
    first = j["first_origin"]
    assert (first["kind"], first["op"], first["step"]) == ("origin", "aten::_ctc_loss", 3), first
    assert first["source"].endswith("ctc_training.py:46 in <module>"), first["source"]
    # Only the loss: +inf for the one sample that cannot be aligned.
    assert (first["elements"], first["posinf"], first["neginf"]) == (4, 1, 0), first
    assert "input_lengths=[20, 17, 15, 12]" in first["inputs"], first["inputs"]
    assert "target_lengths=[5, 4, 3, 8]" in first["inputs"], first["inputs"]
    d = j["diagnosis"]
    assert d["kind"] == "invalid_math", d
    assert "no alignment fits into its input" in " ".join(d["evidence"]), d
    assert "zero_infinity=True" in d["fixes"][0], d["fixes"]


def test_zero_infinity_drops_it_and_the_advice_says_so(out):
    r = preload_run([PYTHON, SCRIPT, "zero-infinity"], out)
    assert r.returncode == 0, r.stderr
    assert "weights finite False" not in r.stdout
    j = view_json(out)
    assert (j["first_origin"]["op"], j["first_origin"]["step"]) == ("aten::_ctc_loss", 3)
    d = j["diagnosis"]
    assert d["kind"] == "healthy" and d["op"] == "aten::_ctc_loss", d
    assert "no alignment fits" in d["fixes"][0] and "finfo" not in d["fixes"][0], d["fixes"]
