"""Interventions switched on by environment, on an unmodified script."""
import math
import sqlite3

from conftest import DEMO, PYTHON, clean_env, nanhunt_run, run


def losses(stdout):
    return [float(l.split()[3]) for l in stdout.splitlines() if l.startswith("step")]


def test_bf16_instead_of_fp16_trains_the_demo_to_a_finite_loss(out):
    plain = run([PYTHON, DEMO])
    assert any(math.isnan(x) for x in losses(plain.stdout)), "the demo must go NaN unaided"
    r = nanhunt_run([PYTHON, DEMO], out, env=clean_env(NANHUNT_AUTOCAST_DTYPE="bf16"))
    assert r.returncode == 0, r.stderr
    trained = losses(r.stdout)
    assert len(trained) == len(losses(plain.stdout)) == 50
    assert all(math.isfinite(x) for x in trained), trained
    [trace] = out.glob("*.sqlite")
    (switched,) = sqlite3.connect(trace).execute(
        "SELECT value FROM meta WHERE key = 'autocast_switched_to_bf16'").fetchone()
    assert int(switched) > 0
    (dtypes,) = sqlite3.connect(trace).execute(
        "SELECT group_concat(DISTINCT dtype) FROM op_stats WHERE op = 'aten::bmm'").fetchone()
    assert dtypes == "bfloat16"


def test_fp32_for_the_named_origin_op_trains_the_demo_to_a_finite_loss(out):
    # aten::bmm is what nanhunt names as the origin (in aten::matmul).
    r = nanhunt_run([PYTHON, DEMO], out, env=clean_env(NANHUNT_FP32_OPS="aten::bmm"))
    assert r.returncode == 0, r.stderr
    trained = losses(r.stdout)
    assert len(trained) == 50
    assert all(math.isfinite(x) for x in trained), trained
    [trace] = out.glob("*.sqlite")
    db = sqlite3.connect(trace)
    (counts,) = db.execute("SELECT value FROM meta WHERE key = 'fp32_ops'").fetchone()
    ran = dict(kv.split("=") for kv in counts.split(","))
    assert int(ran["aten::matmul"]) > 0
    (detail,) = db.execute("SELECT detail FROM events WHERE kind = 'fp32_extended'").fetchone()
    assert detail.startswith("aten::matmul runs in fp32")


def test_fp32_op_that_matches_nothing_stops_at_start(out):
    r = nanhunt_run([PYTHON, "-c", "import torch; print('ran')"], out,
                    env=clean_env(NANHUNT_FP32_OPS="aten::bmmm"))
    assert r.returncode == 2
    assert "NANHUNT_FP32_OPS: 'aten::bmmm' matches no operator" in r.stderr
