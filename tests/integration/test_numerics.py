"""Do no harm: with no intervention switched on, a monitored run computes
exactly what an unmonitored one does."""
from conftest import DEMO, PYTHON, nanhunt_run, run


def test_demo_losses_are_bit_identical_with_and_without_nanhunt(out):
    cmd = [PYTHON, DEMO, "--steps", "44"]
    plain = run(cmd)
    monitored = nanhunt_run(cmd, out)
    assert plain.returncode == monitored.returncode == 0
    # Loss lines carry the float's hex form: equal text is equal bits.
    assert plain.stdout == monitored.stdout
    assert "loss nan" in plain.stdout  # the run does go wrong


def test_fp32_run_is_bit_identical_too(out):
    cmd = [PYTHON, DEMO, "--steps", "20", "--dtype", "float32"]
    assert run(cmd).stdout == nanhunt_run(cmd, out).stdout
