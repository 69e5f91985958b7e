"""Interventions switched on by environment, on an unmodified script."""
import math
import sqlite3

import pytest

from conftest import DEMO, PYTHON, SCRIPTS, clean_env, nanhunt_run, run


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


def test_fp32_auto_learns_the_op_trains_the_demo_and_writes_a_reusable_policy(out, tmp_path):
    r = nanhunt_run([PYTHON, DEMO], out, env=clean_env(NANHUNT_FP32_OPS="auto"))
    assert r.returncode == 0, r.stderr
    trained = losses(r.stdout)
    assert len(trained) == 50 and all(math.isfinite(x) for x in trained), trained
    assert "NANHUNT_FP32_OPS=auto: aten::bmm, aten::matmul now run in fp32 " \
        "(aten::bmm came near fp16's limit at step 13)" in r.stderr
    [policy] = out.glob("*.fp32-policy")
    learned = [l for l in policy.read_text().splitlines() if not l.startswith("#")]
    assert learned == ["aten::bmm", "aten::matmul"]
    assert f"a later run loads them with NANHUNT_POLICY={policy}" in r.stdout + r.stderr
    # The next run starts with the learned ops in fp32: no warning at all.
    again = nanhunt_run([PYTHON, DEMO], tmp_path / "again",
                        env=clean_env(NANHUNT_POLICY=policy))
    assert again.returncode == 0, again.stderr
    assert all(math.isfinite(x) for x in losses(again.stdout))
    assert "warning: aten::bmm" not in again.stderr
    [trace] = (tmp_path / "again").glob("*.sqlite")
    (counts,) = sqlite3.connect(trace).execute(
        "SELECT value FROM meta WHERE key = 'fp32_ops'").fetchone()
    assert int(dict(kv.split("=") for kv in counts.split(","))["aten::matmul"]) == 100


def test_fp32_auto_leaves_the_gradients_a_gradscaler_scales_to_it(out):
    # GradScaler scales the gradients up to fp16's limit and past it on
    # purpose, skipping the steps that overflow: auto learned aten::mm,
    # aten::sum and aten::_to_copy from them, every matmul in fp32 for
    # nothing. The scaler keeps its own decisions, and no warning is live.
    script = SCRIPTS / "gradscaler_training.py"
    plain = run([PYTHON, script])
    r = nanhunt_run([PYTHON, script], out, env=clean_env(NANHUNT_FP32_OPS="auto"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout  # the same skips and scales
    assert "now run" not in r.stderr and "warning:" not in r.stderr, r.stderr
    assert not list(out.glob("*.fp32-policy"))
    [trace] = out.glob("*.sqlite")
    assert sqlite3.connect(trace).execute(
        "SELECT COUNT(*) FROM events WHERE kind = 'fp32_learned'").fetchone() == (0,)


def test_fp32_op_in_a_half_model_computes_in_fp32_and_returns_fp16(out):
    script = SCRIPTS / "half_model_loss_overflow.py"
    plain = run([PYTHON, script])
    assert "step 0 loss inf dtype torch.float16" in plain.stdout
    r = nanhunt_run([PYTHON, script], out, env=clean_env(NANHUNT_FP32_OPS="aten::mse_loss"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 5
    for line in lines:  # the mean of the squares fits; fp16 still flows on
        assert " loss 1400.0000 dtype torch.float16 grads_finite 1" in line, line
    [trace] = out.glob("*.sqlite")
    (counts,) = sqlite3.connect(trace).execute(
        "SELECT value FROM meta WHERE key = 'fp32_ops'").fetchone()
    assert counts == "aten::mse_loss=5"


@pytest.mark.parametrize("op", ["aten::batch_norm", "aten::native_batch_norm"])
def test_fp32_batch_norm_still_updates_the_modules_running_statistics(op, out):
    # The fp32 kernel upcasts its arguments: the fp16 running statistics
    # were copies, updated and dropped, and the model was evaluated with
    # its initial mean 0 and variance 1. They are written back now, in
    # their own dtype (so income's variance is still inf).
    script = SCRIPTS / "batchnorm_on_raw_features.py"
    plain = run([PYTHON, script])
    r = nanhunt_run([PYTHON, script], out, env=clean_env(NANHUNT_FP32_OPS=op))
    assert r.returncode == 0, r.stderr
    [stats] = [l.split() for l in r.stdout.splitlines() if l.startswith("eval mse")]
    [plain_stats] = [l.split() for l in plain.stdout.splitlines() if l.startswith("eval mse")]
    assert stats[3:] == plain_stats[3:] == ["running_var", "[127.0,", "inf,", "0.480224609375]"]
    # The same model but for the rounding of fp32 arithmetic.
    assert float(stats[2]) == pytest.approx(float(plain_stats[2]), rel=1e-3), (stats, plain_stats)
    [trace] = out.glob("*.sqlite")
    (counts,) = sqlite3.connect(trace).execute(
        "SELECT value FROM meta WHERE key = 'fp32_ops'").fetchone()
    assert counts == f"{op}=9", counts  # 8 training steps and the evaluation


def test_fp32_auto_learns_neither_a_cast_nor_a_batch_norm(out):
    # The batch's .half() came near the limit (incomes up to 60000): auto
    # learned aten::_to_copy, whose fp32 kernel casts with _to_copy, called
    # itself and crashed the program. A batch norm's overflow is in the
    # fp16 buffers it writes back into: fp32 would not change it.
    script = SCRIPTS / "batchnorm_on_raw_features.py"
    plain = run([PYTHON, script])
    r = nanhunt_run([PYTHON, script], out, env=clean_env(NANHUNT_FP32_OPS="auto"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout
    assert "now run" not in r.stderr, r.stderr
    assert not list(out.glob("*.fp32-policy"))


def test_fp32_for_a_cast_is_refused_with_the_reason(out):
    r = nanhunt_run([PYTHON, "-c", "import torch"], out,
                    env=clean_env(NANHUNT_FP32_OPS="aten::_to_copy"))
    assert r.returncode == 2
    assert "NANHUNT_FP32_OPS: 'aten::_to_copy' only names casts, which compute nothing to run " \
        "in fp32" in r.stderr, r.stderr
    assert "allowed: ops that compute, like aten::bmm" in r.stderr


def test_fp32_for_an_in_place_op_is_refused_with_the_reason(out):
    r = nanhunt_run([PYTHON, "-c", "import torch"], out,
                    env=clean_env(NANHUNT_FP32_OPS="aten::add_"))
    assert r.returncode == 2
    assert "NANHUNT_FP32_OPS: 'aten::add_' only names ops that write their " \
        "arguments (in-place or out=), which cannot run in fp32" in r.stderr
