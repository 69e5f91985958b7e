"""`nanhunt report`: one self-contained HTML file, opened in a real headless
Chromium: no console errors, no network requests (the page's own policy
refuses them, and a refusal is a console error), every chart drawn with
data points, the origin op shown. Screenshots go under the build folder."""
import html
import json
import re
import shutil
import sqlite3
import subprocess

import pytest

from conftest import BUILD, DEMO, NANHUNT, PYTHON, SCRIPTS, preload_run, run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="scripts/setup.sh installs chromium")


def open_in_chromium(page, screenshot=None):
    """Loads `page`; returns (DOM after load, console lines)."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
             "--window-size=1280,2400"]
    r = subprocess.run(flags + ["--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    console = [l for l in r.stderr.splitlines() if "CONSOLE" in l]
    if screenshot:
        subprocess.run(flags + [f"--screenshot={screenshot}", page.as_uri()],
                       capture_output=True, timeout=120)
    return r.stdout, console


def drawn(dom):
    m = re.search(r'data-charts="([^"]*)"', dom)
    return json.loads(html.unescape(m.group(1))) if m else []


def external_references(page):
    return re.findall(r'(?:src|href)\s*=\s*["\']?(?:https?:)?//', page.read_text())


def test_the_harness_sees_errors_and_requests(tmp_path):
    # A page that breaks both rules must be caught by the same checks.
    bad = tmp_path / "bad.html"
    bad.write_text('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
                   'script-src \'unsafe-inline\'"><img src="http://example.invalid/x.png">'
                   '<script>throw new Error("boom")</script>')
    dom, console = open_in_chromium(bad)
    assert any("boom" in l for l in console), console
    assert any("Refused" in l or "example.invalid" in l for l in console), console
    assert external_references(bad)


@pytest.mark.parametrize("script,charts", [
    (DEMO, {"chart-maxabs", "chart-nonfinite", "chart-underflow"}),
    (SCRIPTS / "gradscaler_training.py", {"chart-maxabs", "chart-scale", "chart-underflow"}),
], ids=["demo", "gradscaler"])
def test_report_opens_offline_with_every_chart_drawn(script, charts, out):
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    page = out / "report.html"
    made = run([NANHUNT, "report", "-o", page, out])
    assert made.returncode == 0, made.stderr
    assert not external_references(page)
    shot = BUILD / f"report-{script.stem}.png"
    dom, console = open_in_chromium(page, screenshot=shot)
    assert console == [], console
    assert 'data-errors' not in dom
    got = {c["id"]: c["points"] for c in drawn(dom)}
    assert charts <= set(got), got
    assert all(n > 0 for n in got.values()), got
    assert shot.exists() and shot.stat().st_size > 10000
    assert "nanhunt's cost: " in dom and " us of host time an op, " in dom
    if script == DEMO:
        assert "aten::bmm (in aten::matmul)" in dom
        assert "Forward overflow: aten::matmul" in dom
        assert "demo/train.py:30" in dom


def report_dom(script_args, out, **env):
    """Runs a Python script under the preload and opens its report, which
    must load without console errors: the DOM after load."""
    r = preload_run([PYTHON, *script_args], out, **env)
    assert r.returncode == 0, r.stderr
    page = out / "report.html"
    made = run([NANHUNT, "report", "-o", page, out])
    assert made.returncode == 0, made.stderr
    dom, console = open_in_chromium(page)
    assert console == [], console
    return dom


def nonfinite_chart(script_args, out):
    """The non-finite chart of a script's report as drawn (its datasets'
    point counts), and the DOM."""
    dom = report_dom(script_args, out)
    [bars] = [c for c in drawn(dom) if c["id"] == "chart-nonfinite"]
    return bars, dom


def test_steps_whose_update_was_skipped_are_grey_among_the_non_finite(out):
    # A loss scaler of the program's own skips 11 of 30 updates: their
    # inf/NaN never reached a weight, and the chart tells them apart.
    bars, dom = nonfinite_chart([SCRIPTS / "own_loss_scaler.py", "set-to-none"], out)
    assert bars["datasets"] == {"inf + NaN values": 0,
                                "in a step whose update was skipped": 11}, bars
    assert "every inf/NaN was in gradients the program&#39;s loss scaler skipped" in dom or \
        "every inf/NaN was in gradients the program's loss scaler skipped" in dom


def test_iterations_given_up_are_grey_among_the_non_finite(out):
    # The program gives iterations 3 and 4 up on a non-finite loss: their
    # inf/NaN never reached a weight either.
    bars, dom = nonfinite_chart([SCRIPTS / "skip_nonfinite_loss.py", "continue"], out)
    assert bars["datasets"] == {"inf + NaN values": 0,
                                "in a step whose update was skipped": 2}, bars
    assert "the program gave up 2 iterations on a non-finite loss (steps 3-4)" in dom


def test_report_says_what_the_gpu_checked(out):
    # A GPU run's trace carries its device counters in meta (this machine
    # has no GPU: they are added to a real CPU run's trace); the report's
    # run line says them, as `view` does.
    r = preload_run([PYTHON, DEMO, "--steps", "3"], out)
    assert r.returncode == 0, r.stderr
    trace = next(out.glob("*.sqlite"))
    with sqlite3.connect(trace) as db:
        db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       [("device_checks", "38640"), ("device_check_batches", "2000"),
                        ("check_ring_waits", "2")])
    page = out / "report.html"
    made = run([NANHUNT, "report", "-o", page, out])
    assert made.returncode == 0, made.stderr
    dom, console = open_in_chromium(page)
    assert console == [], console
    assert ("38640 outputs checked on the GPU in 2000 held-back batches, "
            "result ring full 2 times") in dom


def test_report_names_the_compiled_region_inf_came_out_of(out, tmp_path):
    dom = report_dom([SCRIPTS / "compiled_overflow.py"], out,
                     TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    assert "compiled: non-finite values came out of a torch.compile region" in dom
    assert "Torch-Compiled Region: 0/0, called at " in dom
    assert "Non-finite values came out of a torch.compile region" in dom


def test_report_gives_a_backward_op_the_line_that_called_it_in_the_pass(out):
    # A custom Function's backward overflowed: its line is the backward's,
    # which the report calls the source, not the forward op's line.
    dom = report_dom([SCRIPTS / "custom_function_overflow.py"], out)
    assert re.search(r"<dt>source</dt><dd[^>]*>[^<]*custom_function_overflow\.py:15 in backward",
                     dom), re.findall(r'origin-details.{0,1500}', dom)


def test_report_without_chart_js_names_the_package(out, tmp_path):
    r = preload_run([PYTHON, SCRIPTS / "known_values.py"], out)
    assert r.returncode == 0, r.stderr
    made = run([NANHUNT, "report", "-o", tmp_path / "r.html", "--chart-js",
                tmp_path / "missing.js", out])
    assert made.returncode == 1
    assert "install Debian's libjs-chart.js" in made.stderr
