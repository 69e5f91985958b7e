"""A GradScaler user's loss-scale history and skipped steps, recorded
without any switch, equal what the script itself printed."""
import sqlite3

import pytest

from conftest import PYTHON, SCRIPTS, findings, preload_run, view_json


@pytest.mark.parametrize("mode", [[], ["metric"]])
def test_scale_history_and_skipped_steps_match_the_scripts_own_log(out, mode):
    # metric: a metric of the step's output after backward, with grad mode
    # on, began a step (its ops take tensors that require grad), the first
    # iteration was two steps, and every step after read one too many.
    r = preload_run([PYTHON, SCRIPTS / "gradscaler_training.py", *mode], out)
    assert r.returncode == 0, r.stderr
    printed = []
    for line in r.stdout.splitlines():
        _, step, _, scale, _, skipped = line.split()
        printed.append((int(step), float(scale), int(skipped)))
    # The first step overflows on its own: 2**16 is too large a start.
    assert [p[2] for p in printed] == [1, 0, 1, 0, 0, 1, 0, 0]
    [trace] = out.glob("*.sqlite")
    recorded = sqlite3.connect(trace).execute(
        "SELECT step, scale, skipped FROM loss_scale ORDER BY rowid").fetchall()
    assert recorded == printed
    report = view_json(out)
    assert report["skipped_steps"] == [0, 2, 5]
    assert report["steps"] == 8


def test_the_scaled_loss_and_the_scale_are_not_reported_near_fp16s_limit(out):
    # loss * 65536 (fp32), its gradient and the scale itself are past
    # 65504 on purpose. Before nanhunt knew GradScaler's scale, every
    # GradScaler run warned that aten::mul forward was at 100-600% of fp16's
    # limit and advised fp32 for it; the scaled gradients' own warnings stay.
    r = preload_run([PYTHON, SCRIPTS / "gradscaler_training.py"], out)
    assert r.returncode == 0, r.stderr
    near = [(f["op"], f["phase"]) for f in findings(out, "near_max")]
    assert ("aten::mul", "forward") not in near, near
    assert ("aten::mul", "backward") not in near, near
    assert ("aten::_amp_update_scale_", "forward") not in near, near
    assert ("aten::mm", "backward") in near, near  # a real warning, kept
    [trace] = out.glob("*.sqlite")
    (mul_max,) = sqlite3.connect(trace).execute(
        "SELECT MAX(max_abs) FROM op_stats WHERE op = 'aten::mul' AND phase = 'forward'"
    ).fetchone()
    assert mul_max is None or mul_max < 65504 or mul_max == float("inf"), mul_max
