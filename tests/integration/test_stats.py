"""The statistics in the trace are the values the program computed."""
import json
import sqlite3

from conftest import PYTHON, SCRIPTS, preload_run


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
