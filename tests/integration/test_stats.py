"""The statistics in the trace are the values the program computed."""
import json
import sqlite3

import pytest

from conftest import NANHUNT, PYTHON, SCRIPTS, preload_run, run, view_json


def test_recorded_max_abs_per_op_equals_what_python_computed(out):
    r = preload_run([PYTHON, SCRIPTS / "known_values.py"], out)
    assert r.returncode == 0, r.stderr
    expected = json.loads(r.stdout.strip().splitlines()[-1])
    [trace] = out.glob("*.sqlite")
    db = sqlite3.connect(trace)
    for op, value in expected.items():
        (recorded,) = db.execute(
            "SELECT MAX(max_abs) FROM op_stats WHERE op = ? AND phase = 'forward'",
            (op,)).fetchone()
        assert recorded == value, (op, recorded, value)
    # fp16 cast of values above 65504 overflows: an origin, and the near-max
    # warning of the fp32 mul says it would.
    (kind, op) = db.execute(
        "SELECT kind, op FROM findings WHERE kind = 'origin'").fetchone()
    assert op == "aten::_to_copy"
    # A cast is checked once, by _to_copy: the copy_ inside it writes the
    # same memory and is not scanned (nor reported) a second time.
    assert db.execute("SELECT COUNT(*) FROM op_stats WHERE op = 'aten::copy_'").fetchone() == (0,)
    assert db.execute("SELECT COUNT(*) FROM findings WHERE op = 'aten::copy_'").fetchone() == (0,)


def test_the_trace_says_what_nanhunt_cost_the_host_per_op(out, tmp_path):
    # 64 x 100 additions and nothing else of note: the sampled count of ops
    # (one in 64 timed, scaled back up) must land on it, and a time per op
    # must be there. No GPU: nothing about enqueues is claimed.
    script = tmp_path / "adds.py"
    # (With a Python scalar, add would run four more ops to make it a tensor.)
    script.write_text("import torch\nx, y = torch.ones(8), torch.ones(8)\n"
                      "for _ in range(6400):\n    x = torch.add(x, y)\n")
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    [trace] = out.glob("*.sqlite")
    meta = dict(sqlite3.connect(trace).execute("SELECT key, value FROM meta"))
    assert 6400 <= int(meta["ops_observed"]) <= 6400 + 2 * 64, meta["ops_observed"]
    assert 0 < float(meta["host_us_per_op"]) < 1000
    assert not {"host_us_per_enqueue", "host_us_per_gpu_op", "delivery_seconds"} & set(meta)
    # The view says it too, for a production run's budget.
    cost = view_json(out)["cost"]
    assert cost["ops_observed"] == int(meta["ops_observed"])
    assert cost["host_us_per_op"] == pytest.approx(float(meta["host_us_per_op"]), abs=0.01)
    text = run([NANHUNT, "view", out]).stdout
    assert f"an op in nanhunt's callbacks, {meta['ops_observed']} ops" in text
