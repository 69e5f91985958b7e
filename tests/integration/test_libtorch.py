"""A C++ LibTorch program, built by the tests, under `nanhunt run`."""
from conftest import BUILD, nanhunt_run, run, view_json

PROGRAM = BUILD / "tests" / "libtorch_train"


def test_libtorch_program_is_monitored_like_python(out):
    r = nanhunt_run([PROGRAM, "3", "6"], out)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    first = report["first_origin"]
    assert first["kind"] == "origin"
    assert first["op"] == "aten::dot"
    assert first["phase"] == "forward"
    assert first["step"] == 3
    assert first["fp32_max_abs"] == 360000.0
    # No Python here: the location is the program's own frame.
    assert "main" in first["source"] and "libtorch_train" in first["source"]
    assert report["steps"] == 6


def test_libtorch_losses_are_bit_identical_under_nanhunt(out):
    plain = run([PROGRAM, "99", "8"])
    monitored = nanhunt_run([PROGRAM, "99", "8"], out)
    assert plain.returncode == monitored.returncode == 0
    assert plain.stdout == monitored.stdout
