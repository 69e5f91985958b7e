"""A trace of a million op_stats rows (a long run) is summarised, shows a
progress line on a terminal while it reads, and a copy cut in half still
opens with what can be read. (How fast: bench/viewer_bench.sh.)"""
import json
import os
import pty
import subprocess

import pytest

from conftest import DEMO, NANHUNT, PYTHON, ROOT, clean_env, preload_run, run


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    out = tmp_path_factory.mktemp("big")
    r = preload_run([PYTHON, DEMO], out / "run")
    assert r.returncode == 0, r.stderr
    [trace] = (out / "run").glob("*.sqlite")
    made = run([PYTHON, ROOT / "bench" / "big_trace.py", trace, out / "big.sqlite", 1000000])
    assert made.returncode == 0, made.stderr
    return out / "big.sqlite"


def test_a_million_rows_are_summarised(big):
    r = run([NANHUNT, "view", "--json", big])
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["steps"] > 20000
    assert report["diagnosis"]["kind"] == "forward_overflow"
    assert report["problems"] == []
    assert "reading" not in r.stderr  # not a terminal: no progress line


def test_a_progress_line_shows_on_a_terminal(big):
    leader, follower = pty.openpty()
    p = subprocess.Popen([str(NANHUNT), "view", str(big)], stdout=subprocess.DEVNULL,
                         stderr=follower, env=clean_env(NANHUNT_PROGRESS_MS="0"))
    os.close(follower)
    seen = b""
    while True:  # read while it runs: a full terminal buffer would stall it
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the other end closed: the process is done
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    p.wait(timeout=120)
    assert p.returncode == 0
    assert f"nanhunt: reading {big}...".encode() in seen, seen[:200]
    assert seen.endswith(b"\r\x1b[K")  # cleared when done


def test_a_trace_cut_in_half_still_opens(big, tmp_path):
    cut = tmp_path / "cut.sqlite"
    data = big.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    r = run([NANHUNT, "view", "--json", cut])
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["problems"], "a cut trace must say so"
    assert any("read only in part" in p or "unreadable" in p for p in report["problems"])
    text = run([NANHUNT, "view", cut]).stdout
    assert "NOTES" in text and "DIAGNOSIS" in text
