"""The GPU benchmark's script (bench/gpt2_bench.py, run by
scripts/gpu-check.sh on a lent GPU, where a broken script would cost the
lease) runs every mode and prints its table, here on the CPU with the tiny
model. Its "empty-callbacks" mode observes the ops nanhunt observes, with
torch's callbacks asking for inputs and outputs and doing nothing."""
import re

from conftest import PYTHON, ROOT, run


def test_every_mode_runs_and_prints_its_row():
    r = run([PYTHON, ROOT / "bench" / "gpt2_bench.py", "--device", "cpu", "--tiny",
             "--rounds", "1", "--steps", "2"], timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {m.group(1).strip(): float(m.group(2))
            for m in re.finditer(r"^( *\S.*?)\s+([\d.]+)\s+[\d.]+x", r.stdout, re.M)}
    assert set(rows) == {
        "plain", "torch's op callbacks, empty", "nanhunt (every op checked)",
        "the same, kernel names on", "the same, batches (auto)",
        "nanhunt sample (1% of ops)", "set_detect_anomaly(True)"}, r.stdout
    # The empty callback saw about the ops nanhunt's callbacks saw a step
    # (its count includes the model's set-up and autograd's records).
    empty = int(re.search(r"ops a step: about (\d+)", r.stdout).group(1))
    observed = [int(n) for n in re.findall(r"host, a step: (\d+) ops", r.stdout)]
    assert observed, r.stdout
    every_op = observed[0]
    assert every_op > 1000
    assert every_op <= empty < 2 * every_op, r.stdout
