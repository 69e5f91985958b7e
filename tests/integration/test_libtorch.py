"""A C++ LibTorch program, built by the tests, under `nanhunt run`."""
import re
import sqlite3
from pathlib import Path

import pytest
import torch
from conftest import BUILD, LIBNANHUNT, clean_env, nanhunt_run, run, view_json

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


def test_a_libtorch_parameter_that_came_non_finite_is_blamed_not_the_data(out):
    # No Python to name it by: a leaf that requires grad is a parameter.
    r = nanhunt_run([PROGRAM, "-1", "2", "1", "nan-weight"], out)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    first = report["first_origin"]
    assert (first["kind"], first["step"]) == ("input", 0), first
    assert "(parameter)" in first["inputs"], first
    d = report["diagnosis"]
    assert d["title"] == "The model's parameters brought NaN, not the data", d
    assert "read a parameter (a leaf that requires grad)" in d["evidence"][0], d


@pytest.mark.parametrize("overflow_step", [0, 3])
def test_libtorch_micro_batches_are_counted_in_their_step(out, overflow_step):
    # Three micro-batches of gradient accumulation per SGD step: nothing
    # marks where a C++ program's iteration ends but its update (ops with
    # grad mode off). The overflow in a step's last micro-batch must not be
    # counted two steps later; in step 0, before any update showed the
    # pattern, the rows written under tentative numbers are renumbered.
    r = nanhunt_run([PROGRAM, str(overflow_step), "6", "3"], out)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    first = report["first_origin"]
    assert (first["op"], first["step"]) == ("aten::dot", overflow_step), first
    assert report["steps"] == 6
    [trace] = out.glob("*.sqlite")
    steps = sqlite3.connect(trace).execute(
        "SELECT DISTINCT step FROM steps ORDER BY step").fetchall()
    assert steps == [(s,) for s in range(6)]


def test_libtorch_first_layers_overflow_is_in_the_step_it_begins(out):
    # The step's first op (the linear layer's addmm, under fp16 autocast)
    # begins the step at its start: the cast inside it, which ends first,
    # is in step 3, not in step 2 whose update came before.
    r = nanhunt_run([PROGRAM, "3", "6", "1", "first-layer"], out)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    first = report["first_origin"]
    assert first["op"] == "aten::_to_copy" and first["top_op"] in ("aten::linear", "aten::addmm")
    assert (first["phase"], first["step"]) == ("forward", 3), first
    assert report["steps"] == 6


def test_libtorch_losses_are_bit_identical_under_nanhunt(out):
    plain = run([PROGRAM, "99", "8"])
    monitored = nanhunt_run([PROGRAM, "99", "8"], out)
    assert plain.returncode == monitored.returncode == 0
    assert plain.stdout == monitored.stdout


def test_a_plugin_built_against_another_torch_is_not_started(out, tmp_path):
    # nanhunt built against one torch, the program run against another (a
    # conda environment beside the venv nanhunt was built with): the
    # plugin's inline code would read that torch's objects with the wrong
    # layout. This torch's libraries, in a folder whose version.py says
    # 2.99.0 (found first: the program's RUNPATH comes after
    # LD_LIBRARY_PATH).
    real = Path(torch_lib_dir())
    fake = tmp_path / "torch"
    (fake / "lib").mkdir(parents=True)
    for lib in real.iterdir():
        (fake / "lib" / lib.name).symlink_to(lib)
    (fake / "version.py").write_text("__version__ = '2.99.0+cu999'\n")
    env = clean_env(LD_LIBRARY_PATH=fake / "lib")
    plain = run([PROGRAM, "3", "6"], env=env)
    r = nanhunt_run([PROGRAM, "3", "6"], out, env=env)
    assert r.returncode == plain.returncode == 0, r.stderr
    assert r.stdout == plain.stdout  # the training ran, untouched
    built = torch.__version__.split("+")[0]
    assert re.search(
        rf"nanhunt: the torch plugin \S*/libnanhunt_torch\.so was built against torch "
        rf"{re.escape(built)}, but this process runs torch 2\.99\.0\+cu999 "
        rf"\({re.escape(str(fake / 'lib'))}\)\. Rebuild nanhunt against this torch: "
        r"NANHUNT_PYTHON=/path/to/its/python scripts/build.sh; "
        r"monitoring is off for this process\.\n", r.stderr), r.stderr
    assert "nanhunt did not start in it" in r.stderr
    assert not list(out.glob("*.sqlite"))  # nothing was monitored
    # The same folder with this torch's own version: monitored as ever.
    (fake / "version.py").write_text(f"__version__ = '{torch.__version__}'\n")
    r = nanhunt_run([PROGRAM, "3", "6"], out, env=env)
    assert r.returncode == 0 and "built against" not in r.stderr, r.stderr
    assert view_json(out)["first_origin"]["op"] == "aten::dot"


def torch_lib_dir():
    return Path(torch.__file__).parent / "lib"


def test_the_fallbacks_for_older_torch_releases_answer_what_torch_does():
    # torch_compat.h's branches for torch before 2.7 (an op's overload name
    # from operator_name(), interned) and before 2.11 (the stream handle
    # from libc10_cuda's CUDAStream::stream(), called by name), run with
    # this torch, which has what they stand in for.
    r = run([BUILD / "tests" / "torch_compat_probe"])
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"overload names: (\d+) compared, 0 differ, 0 moved; overloads: (.*)", r.stdout)
    assert m and int(m[1]) >= 1000, r.stdout
    assert {"Tensor", "Scalar", "dim_IntList", "IntList_out"} <= set(m[2].split()), r.stdout
    if "libc10_cuda.so: loaded" in r.stdout:  # a CUDA build of torch
        # Found and called: a handle with a driver; without one, torch's
        # own error, caught and named, not a crash.
        assert re.search(r"stream handle: (0x[0-9a-f]+|\(nil\))\n|stream handle: none: "
                         r"c10::cuda::CUDAStream::stream\(\): ", r.stdout), r.stdout
