"""NANHUNT_ON_NONFINITE and NANHUNT_SNAPSHOT_DIR: stop at the first
non-finite origin, with a snapshot that reproduces it."""
import os
import signal
import sqlite3
import stat
import subprocess
import time

from conftest import (DEMO, LIBNANHUNT, NANHUNT, PYTHON, SCRIPTS, clean_env,
                      nanhunt_run, preload_run, run)


def test_raise_stops_training_with_a_catchable_exception_naming_op_phase_step(out):
    r = preload_run([PYTHON, SCRIPTS / "guarded_training.py"], out,
                    NANHUNT_ON_NONFINITE="raise")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "finished step 2" in lines
    assert not any(l.startswith("finished step 4") for l in lines), r.stdout
    [caught] = [l for l in lines if l.startswith("caught")]
    assert "NonFiniteError" in caught
    assert "aten::mm" in caught or "aten::dot" in caught or "aten::mv" in caught, caught
    assert "(forward) at step 3" in caught


def test_uncaught_raise_ends_the_demo_at_the_origin_step(out):
    r = nanhunt_run([PYTHON, DEMO], out, env=clean_env(NANHUNT_ON_NONFINITE="raise"))
    assert r.returncode == 1
    assert "NonFiniteError: nanhunt: non-finite values first produced by aten::bmm (forward) at step 26" in r.stderr
    assert "step  26" not in r.stdout


def test_under_a_gradscaler_its_overflows_go_on_and_nan_of_finite_gradients_stops(out, tmp_path):
    # GradScaler scales the gradients into overflow on purpose and skips
    # those steps (routinely at step 0, while its scale settles): raise
    # stopped every GradScaler run there. It stops at NaN made of finite
    # gradients (a square root at 0 that a torch.where left out: its
    # backward's 0/0), which no scale explains. (A norm of zeros was the
    # plant before: its backward's 0/0 is torch's own, masked right after.)
    scaler_run = run([PYTHON, SCRIPTS / "gradscaler_training.py"])
    r = preload_run([PYTHON, SCRIPTS / "gradscaler_training.py"], out,
                    NANHUNT_ON_NONFINITE="raise")
    assert r.returncode == 0 and r.stdout == scaler_run.stdout, r.stderr
    assert "first non-finite: origin aten::sum (backward) at step 0" in r.stderr  # the plant
    script = tmp_path / "nan_gradient.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(8, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "scaler = torch.amp.GradScaler('cpu')\n"
        "x, y = torch.randn(16, 8), torch.randn(16, 1)\n"
        "for step in range(4):\n"
        "    opt.zero_grad()\n"
        "    with torch.autocast('cpu', dtype=torch.float16):\n"
        "        loss = torch.nn.functional.mse_loss(model(x).float(), y)\n"
        "    if step == 2:\n"
        "        zeros = model.weight * 0\n"
        "        loss = loss + torch.where(zeros > 1, zeros.sqrt(), 0).sum()  # 0/0 in backward\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n"
        "    print('finished step', step, flush=True)\n")
    stopped = preload_run([PYTHON, script], tmp_path / "nan", NANHUNT_ON_NONFINITE="raise")
    assert stopped.returncode == 1
    assert "NonFiniteError: nanhunt: non-finite values first produced by aten::div " \
        "(backward) at step 2" in stopped.stderr, stopped.stderr
    assert stopped.stdout.splitlines() == ["finished step 0", "finished step 1"]


def test_abort_kills_the_process_after_the_trace_has_the_origin(out):
    r = preload_run([PYTHON, SCRIPTS / "overflow_dot.py"], out,
                    NANHUNT_ON_NONFINITE="abort")
    assert r.returncode == -signal.SIGABRT
    assert "nanhunt: aborting: non-finite values first produced by aten::dot" in r.stderr
    [trace] = out.glob("*.sqlite")
    db = sqlite3.connect(trace)
    assert db.execute("SELECT op FROM findings WHERE kind='origin'").fetchone() == ("aten::dot",)
    assert db.execute("SELECT kind FROM events").fetchone() == ("stopped",)


def test_snapshot_is_private_loads_with_torch_and_replays_the_overflow(out, tmp_path):
    snaps = tmp_path / "snaps"
    r = preload_run([PYTHON, SCRIPTS / "guarded_training.py"], out,
                    NANHUNT_ON_NONFINITE="raise", NANHUNT_SNAPSHOT_DIR=snaps)
    assert r.returncode == 0, r.stderr
    [snap] = snaps.glob("*.pt")
    assert stat.S_IMODE(snaps.stat().st_mode) == 0o700
    assert stat.S_IMODE(snap.stat().st_mode) == 0o600
    check = run([PYTHON, "-c",
                 "import sys, torch; d = torch.load(sys.argv[1], weights_only=False); "
                 "print(d['op'], d['finding']['step'], [tuple(a.shape) for a in d['args'] "
                 "if isinstance(a, torch.Tensor)])", snap])
    assert check.returncode == 0, check.stderr
    assert " 3 " in check.stdout
    replay = run([NANHUNT, "replay", snap], env=dict(os.environ, NANHUNT_PYTHON=PYTHON))
    assert replay.returncode == 0, replay.stderr
    rows = {l.split()[0]: l.split() for l in replay.stdout.splitlines()[1:]
            if l.split() and l.split()[0] in ("float16", "bfloat16", "float32")}
    assert rows["float16"][1] == "NO"
    assert rows["float32"][1] == "yes"
    assert float(rows["float32"][2]) > 65504


def start_with_config(script, out, conf, text, steps):
    """Starts SCRIPT monitored with config file CONF holding TEXT; returns
    once it printed STEPS step lines."""
    conf.write_text(text)
    env = clean_env(LD_PRELOAD=LIBNANHUNT, NANHUNT_OUT=out, NANHUNT_CONFIG=conf,
                    NANHUNT_QUIET=1)
    proc = subprocess.Popen([PYTHON, str(SCRIPTS / script)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(steps):
        assert proc.stdout.readline().startswith("step")
    time.sleep(0.1)  # the edit gets a modification time of its own
    return proc


def test_config_file_edit_switches_the_guard_on_in_a_running_process(out, tmp_path):
    conf = tmp_path / "nanhunt.conf"
    proc = start_with_config("overflow_every_step.py", out, conf,
                             "on_nonfinite = continue\n", 5)
    conf.write_text("on_nonfinite = raise\n")
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    [caught] = [l for l in rest.splitlines() if l.startswith("caught")]
    assert "aten::dot (forward)" in caught
    steps = [l for l in rest.splitlines() if l.startswith("step")]
    assert len(steps) < 100, "the edit must apply within seconds"
    [trace] = out.glob("*.sqlite")
    (detail,) = sqlite3.connect(trace).execute(
        "SELECT detail FROM events WHERE kind = 'config_reloaded'").fetchone()
    assert "applied: NANHUNT_ON_NONFINITE" in detail


def test_bad_config_edit_is_rejected_and_the_run_goes_on(out, tmp_path):
    conf = tmp_path / "nanhunt.conf"
    proc = start_with_config("long_training.py", out, conf, "near_max = 1000\n", 3)
    conf.write_text("on_nonfinite = sometimes\n")
    time.sleep(2.5)
    assert proc.poll() is None, "a bad edit must not stop training"
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert "config reload (config file changed) rejected" in err
    assert "NANHUNT_ON_NONFINITE='sometimes'" in err


def skipped_steps(out):
    [trace] = out.glob("*.sqlite")
    return [s for (s,) in sqlite3.connect(trace).execute(
        "SELECT step FROM skipped_steps ORDER BY step")]


def test_config_file_edit_switches_step_skipping_off_in_a_running_process(out, tmp_path):
    # Skipping on at start: every odd step's NaN gradient is held back; the
    # edit switches it off, and the next bad step reaches the weights.
    conf = tmp_path / "nanhunt.conf"
    proc = start_with_config("bad_gradients_until_stopped.py", out, conf,
                             "skip_nonfinite_steps = 1\n", 10)
    conf.write_text("skip_nonfinite_steps = 0\n")
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    skipped = skipped_steps(out)
    assert {1, 3, 5, 7, 9} <= set(skipped), skipped
    assert max(skipped) < 100, "the edit must apply within seconds"
    assert rest.splitlines()[-1].endswith("nan"), "unskipped NaN gradients reach the weights"


def test_config_file_edit_switches_step_skipping_on_in_a_running_process(out, tmp_path):
    conf = tmp_path / "nanhunt.conf"
    proc = start_with_config("bad_gradients_until_stopped.py", out, conf,
                             "near_max = 16376\n", 10)
    conf.write_text("near_max = 16376\nskip_nonfinite_steps = 1\n")
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    skipped = skipped_steps(out)
    assert skipped and min(skipped) >= 10, skipped
    assert 159 in skipped, "every step from the edit on is skipped (the weights went NaN before)"
