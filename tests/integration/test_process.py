"""nanhunt as a good guest: exit codes, signals, forks, children, bad
settings, processes without torch, and traces of killed processes."""
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

from conftest import (BUILD, LIBNANHUNT, NANHUNT, PYTHON, SCRIPTS, clean_env, compiled_runs,
                      nanhunt_run, preload_run, run, view_json)


def test_process_without_torch_is_untouched(out, tmp_path):
    r = nanhunt_run(["/bin/true"], out)
    assert r.returncode == 0
    assert r.stdout == ""
    assert not out.exists() or not list(out.glob("*.sqlite"))
    direct = preload_run(["/bin/echo", "hi"], out)
    assert (direct.returncode, direct.stdout, direct.stderr) == (0, "hi\n", "")


def test_bash_wrapper_runs_and_its_python_child_is_monitored(out, tmp_path):
    wrapper = tmp_path / "train.sh"
    wrapper.write_text(f"#!/bin/bash\necho wrapper\nexec {PYTHON} {SCRIPTS / 'overflow_dot.py'}\n")
    wrapper.chmod(0o755)
    r = nanhunt_run(["bash", wrapper], out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("wrapper\n")
    assert view_json(out)["first_origin"]["op"] == "aten::dot"
    plain = nanhunt_run(["bash", "-c", "exit 0"], out)
    assert plain.returncode == 0


def test_exit_code_of_the_command_is_returned(out):
    r = nanhunt_run([PYTHON, "-c", "import torch, sys; sys.exit(3)"], out)
    assert r.returncode == 3


def test_bad_setting_fails_fast_naming_setting_value_and_allowed(out):
    env = clean_env(NANHUNT_MODE="chek")
    r = preload_run([PYTHON, "-c", "print('ran')"], out, NANHUNT_MODE="chek")
    assert r.returncode == 2
    assert "ran" not in r.stdout
    assert "NANHUNT_MODE='chek' is not valid; allowed: off, check" in r.stderr
    via_cli = nanhunt_run([PYTHON, "-c", "print('ran')"], out, env=env)
    assert via_cli.returncode == 2 and "NANHUNT_MODE" in via_cli.stderr
    typo = preload_run([PYTHON, "-c", "print('ran')"], out, NANHUNT_NEAR_MAXX="1")
    assert typo.returncode == 2
    assert "unknown setting NANHUNT_NEAR_MAXX" in typo.stderr


def test_mode_off_loads_nothing(out):
    r = preload_run([PYTHON, SCRIPTS / "overflow_dot.py"], out, NANHUNT_MODE="off")
    assert r.returncode == 0 and r.stderr == ""
    assert not out.exists()


def test_dataloader_with_two_worker_processes(out):
    r = nanhunt_run([PYTHON, SCRIPTS / "dataloader_workers.py"], out)
    assert r.returncode == 0, r.stderr
    assert "done" in r.stdout
    assert "parent alive" in r.stdout  # a SIGTERM to a worker stays there
    traces = list(out.glob("*.sqlite"))
    assert len(traces) == 1, "forked workers must not write traces"
    report = view_json(out)
    assert report["steps"] == 16  # the second loader trains no steps
    assert report["first_origin"] is None


def test_children_are_followed_unless_switched_off(out):
    r = nanhunt_run([PYTHON, SCRIPTS / "spawn_child.py"], out)
    assert r.returncode == 0, r.stderr
    assert len(list(out.glob("*.sqlite"))) == 1  # the child's; the parent never loads torch
    off = out.parent / "off"
    env = clean_env(NANHUNT_FOLLOW_CHILDREN="0")
    r = nanhunt_run([PYTHON, SCRIPTS / "spawn_child.py"], off, env=env)
    assert r.returncode == 0, r.stderr
    assert not list(off.glob("*.sqlite"))


def test_dlopen_of_a_bare_name_still_uses_the_callers_rpath(out):
    probe = BUILD / "tests" / "librpath_probe.so"
    r = preload_run([PYTHON, SCRIPTS / "rpath_probe.py", probe], out)
    assert r.stdout.strip() == "42", r.stderr


def wait_for_steps(proc, n):
    for _ in range(n):
        line = proc.stdout.readline()
        assert line.startswith("step"), line


def start_long_training(out):
    env = clean_env(LD_PRELOAD=LIBNANHUNT, NANHUNT_OUT=out, NANHUNT_FLUSH_MS=50)
    return subprocess.Popen([PYTHON, str(SCRIPTS / "long_training.py")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_trace_of_a_process_killed_with_sigkill_still_opens(out):
    proc = start_long_training(out)
    wait_for_steps(proc, 30)
    time.sleep(0.3)  # a few commits
    proc.kill()
    proc.wait()
    report = view_json(out)
    assert report["steps"] >= 10
    assert any("did not finish" in p for p in report["problems"])


def test_sigterm_commits_the_trace_then_dies_of_sigterm(out):
    proc = start_long_training(out)
    wait_for_steps(proc, 20)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    [trace] = out.glob("*.sqlite")
    meta = dict(sqlite3.connect(trace).execute("SELECT key, value FROM meta"))
    assert "ended" in meta, "the final commit must happen before dying"


def test_signals_sent_to_nanhunt_run_reach_the_command(out):
    proc = subprocess.Popen([str(NANHUNT), "run", "--out", str(out), "--", PYTHON,
                             str(SCRIPTS / "long_training.py")],
                            env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for_steps(proc, 5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM


def test_readme_configuration_table_is_the_generated_one():
    table = run([NANHUNT, "settings", "--markdown"]).stdout
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert table in readme, "README's settings table is stale: paste `nanhunt settings --markdown`"


def test_outputs_the_check_cannot_read_are_counted_not_called_finite(out, tmp_path):
    # oneDNN's opaque layout has no memory the check can read; a sparse
    # tensor's values are read (test_tensor_kinds.py); meta tensors hold no
    # values to read.
    script = tmp_path / "unreadable.py"
    script.write_text("import torch\nx = torch.randn(4, 4).to_mkldnn()\nprint((x + x).shape)\n"
                      "s = torch.randn(4, 4).to_sparse()\nprint((s @ s).shape)\n"
                      "m = torch.randn(4, 4).to('meta')\nprint((m @ m).shape)\n")
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    assert any("floating-point op outputs were not checked" in p and "mkldnn" in p
               for p in report["problems"]), report["problems"]
    # Which ops, and why: the sum's output and the cast that made its input.
    unchecked = {u["op"]: u for u in report["unchecked_ops"]}
    assert unchecked["aten::add"] == {"op": "aten::add", "phase": "forward",
                                      "reason": "unreadable", "outputs": 1,
                                      "first_step": 0, "last_step": 0}, unchecked
    assert set(unchecked) == {"aten::add", "aten::to_mkldnn"}, unchecked


def test_a_helper_the_training_starts_does_not_hide_the_trainings_trace(out):
    r = preload_run([PYTHON, SCRIPTS / "overflow_then_helper.py"], out)
    assert r.returncode == 0, r.stderr
    assert len(list(out.glob("*.sqlite"))) == 2  # the training's, the helper's
    report = view_json(out)
    assert report["first_origin"]["op"] == "aten::dot"
    assert len(report["traces"]) == 2, report["traces"]
    # One exit summary, the training's: the helper, which found nothing,
    # does not print "no non-finite values seen" under the training's origin.
    assert r.stderr.count("nanhunt: trace ") == 1, r.stderr
    assert "first non-finite: origin aten::dot" in r.stderr, r.stderr
    assert "no non-finite values seen" not in r.stderr, r.stderr


def test_torch_compile_tracing_does_not_switch_monitoring_off(out, tmp_path):
    # A cold inductor cache: inductor then probes its freshly built kernel in
    # a child Python, which loads libtorch and so writes a trace of its own.
    r = preload_run([PYTHON, SCRIPTS / "compiled_then_overflow.py"], out,
                    TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr
    report = view_json(out)
    assert report["first_origin"]["op"] == "aten::dot"
    assert not any("monitoring stopped" in p for p in report["problems"])
    # Tracing works out shapes on meta tensors: no values, none unchecked.
    assert report["unchecked_ops"] == [], report["unchecked_ops"]


def test_a_compiled_optimizer_step_breaks_its_graph_no_more_than_unmonitored(out, tmp_path):
    # nanhunt names each optimizer that steps from a hook torch.compile
    # traces into the compiled step: a call into nanhunt there would break
    # its graph (and fail a fullgraph=True compile).
    monitored, plain = compiled_runs(SCRIPTS / "compiled_optimizer_step.py", out, tmp_path)
    assert "graph breaks" in plain.stdout, plain.stdout
    assert "internal error" not in monitored.stderr, monitored.stderr


def test_no_tensor_outlives_its_last_reference(out):
    # Monitored, every tensor goes when the program lets go of it, as it
    # does unmonitored: its memory is free again and its weakrefs are dead.
    script = SCRIPTS / "tensors_freed_after_ops.py"
    plain = run([PYTHON, script])
    monitored = preload_run([PYTHON, script], out)
    assert plain.returncode == 0 and monitored.returncode == 0, monitored.stderr
    assert "alive" not in plain.stdout, plain.stdout
    assert monitored.stdout == plain.stdout, monitored.stdout
    assert len(plain.stdout.splitlines()) == 8
