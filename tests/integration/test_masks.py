"""-inf masks are put into attention scores on purpose: nanhunt must not call
them non-finite data or an origin, and must still catch what a mask can
break (a row masked entirely makes NaN in softmax)."""
import re

import pytest

from conftest import (NANHUNT, PYTHON, SCRIPTS, findings, origin_of_failing_run,
                      plain_and_monitored, preload_run, preload_script, run, view_json)

SCRIPT = SCRIPTS / "masked_attention.py"


def run_healthy(script, out, mask_ops):
    """Runs `script` under the preload: no finding, every step finite, each
    of `mask_ops` listed as a mask. Returns the view's JSON."""
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    assert "first non-finite" not in r.stderr, r.stderr
    j = view_json(out)
    assert j["diagnosis"]["kind"] == "healthy", j["diagnosis"]
    assert j["first_origin"] is None and j["nonfinite_steps"] == []
    for op in mask_ops:
        assert op in j["mask_ops"], j["mask_ops"]
    return j


def test_minus_inf_masks_in_attention_are_healthy(out):
    j = run_healthy(SCRIPT, out, ("aten::masked_fill", "aten::where", "aten::full"))
    assert findings(out) == [] or all(f["kind"] in ("near_max", "underflow")
                                      for f in findings(out))
    masked = [o for o in j["ops"] if o["mask"]]
    assert masked and not any(o["overflowed"] for o in masked)
    text = run([NANHUNT, "view", out]).stdout
    assert "apart from deliberate ±inf masks" in text
    assert "STEPS  ......" in text


def test_a_row_masked_entirely_is_the_origin_of_nan_in_softmax(out):
    r = preload_run([PYTHON, SCRIPT], out, FULLY_MASKED="3")
    assert r.returncode == 0, r.stderr
    j = view_json(out)
    first = j["first_origin"]
    assert (first["kind"], first["op"], first["step"]) == ("origin", "aten::_softmax", 3), first
    assert first["source"].endswith("masked_attention.py:31 in <module>")
    d = j["diagnosis"]
    assert d["kind"] == "invalid_math", d
    assert "every entry is -inf" in " ".join(d["evidence"])
    assert "torch.finfo(dtype).min" in " ".join(d["fixes"])


def test_a_hugging_face_attention_mask_given_to_multihead_attention_is_named_inverted(out):
    # key_padding_mask=attention_mask.bool(): nn.MultiheadAttention masks
    # where True, so the sample without padding has every key masked. Its
    # softmax is torch's own code's, inside nn.MultiheadAttention; it said
    # "mask with torch.finfo(dtype).min instead of -inf", which a boolean
    # key_padding_mask cannot do.
    script = SCRIPTS / "attention_padding_mask.py"
    first, d = origin_of_failing_run([PYTHON, script, "as-is"], out, "step 0 loss nan")
    assert (first["op"], first["step"]) == ("aten::_softmax", 0), first
    assert first["source"].endswith("attention_padding_mask.py:34 in <module>"), first
    assert first["via"].startswith(
        "multi_head_attention_forward (torch/nn/functional.py:"), first
    assert any(e.startswith("the op is nn.MultiheadAttention's own") and
               "a sample whose every key is True" in e for e in d["evidence"]), d["evidence"]
    assert d["fixes"][0].startswith("give nn.MultiheadAttention a key_padding_mask that is True "
                                    "at the padding only"), d["fixes"]
    assert "~attention_mask.bool()" in d["fixes"][0], d["fixes"]
    assert not any("torch.finfo(dtype).min" in f for f in d["fixes"]), d["fixes"]
    plain_and_monitored([PYTHON, script, "inverted"], out.parent / "fixed")
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_the_report_neither_charts_nor_counts_masks(out, tmp_path):
    r = preload_run([PYTHON, SCRIPT], out)
    assert r.returncode == 0, r.stderr
    page = tmp_path / "report.html"
    made = run([NANHUNT, "report", "-o", page, out])
    assert made.returncode == 0, made.stderr
    html = page.read_text()
    # No step with inf/NaN values: the masks are not counted as any.
    assert '"nonfinite":[]' in html, re.search(r'"nonfinite":.{0,80}', html)
    charted = re.findall(r'\{"name":"(aten::[a-z_]+) \(', html)
    assert charted and not set(charted) & {"aten::masked_fill", "aten::masked_fill_",
                                          "aten::add", "aten::full", "aten::triu"}, charted


def test_checking_for_inf_with_isfinite_is_not_a_finding(out, tmp_path):
    # torch.isfinite(x) and torch.isinf(x) compare |x| with a Python inf,
    # which torch wraps into a tensor and casts to x's dtype (_to_copy): that
    # inf is the program's own number, not non-finite data. The training
    # loop that checks its loss each step stays healthy.
    preload_script(
        tmp_path / "guarded_loop.py",
        "import torch\n"
        "model = torch.nn.Linear(8, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "x, y = torch.randn(16, 8), torch.randn(16, 1)\n"
        "for step in range(4):\n"
        "    opt.zero_grad()\n"
        "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "    assert torch.isfinite(loss).all() and not torch.isinf(loss).any()\n"
        "    loss.backward()\n"
        "    opt.step()\n", out)
    assert findings(out, "propagated") == [] and findings(out, "origin") == []
    j = view_json(out)
    assert j["diagnosis"]["kind"] == "healthy", j["diagnosis"]
    assert j["nonfinite_steps"] == []
    # Nor is it a mask: the program wrote no mask.
    assert j["mask_ops"] == [], j["mask_ops"]
    assert "mask" not in run([NANHUNT, "view", out]).stdout


def test_a_large_number_the_program_writes_is_no_warning(out, tmp_path):
    # `h * 30000.0` and a loss scaled by hand with `* 2.0**24`: torch wraps
    # each Python float into a one-value tensor and casts it to the other
    # operand's dtype (_to_copy inside the mul). The literal is the
    # program's own, large on purpose: before, its cast was warned about
    # live ("aten::_to_copy (forward) reached |x|=30000") and listed as
    # would-overflow at 2**24. What the literal makes is judged at the mul.
    r = preload_script(
        tmp_path / "literal_scale.py",
        "import torch\n"
        "torch.manual_seed(0)\n"
        "w = torch.nn.Parameter(torch.randn(8, 8) * 0.1)\n"
        "for step in range(3):\n"
        "    x = torch.rand(4, 8) * 0.1\n"
        "    h = torch.ones(4, dtype=torch.half) * 30000.0\n"
        "    ((x @ w).square().mean() * 2.0**24).backward()\n"
        "    w.grad = None\n", out)
    assert "_to_copy" not in r.stderr, r.stderr
    assert "aten::mul (forward) reached |x|=30000" in r.stderr, r.stderr
    rows = findings(out)
    assert [f["op"] for f in rows if f["op"] == "aten::_to_copy"] == [], rows
    j = view_json(out)
    casts = [o for o in j["ops"] if o["op"] == "aten::_to_copy" and o["phase"] == "forward"]
    assert casts and all(o["max_abs"] < 100 for o in casts), casts
    assert any(o["op"] == "aten::mul" and o["max_abs"] >= 2.0**24 for o in j["ops"]), j["ops"]


def test_a_cast_that_overflows_is_shown_beside_the_casts_of_masks(out, tmp_path):
    # A loop that checks its loss with isfinite and masks with a cast of
    # -inf, and whose cast of its fp32 input to fp16 overflows at step 3:
    # the cast's calls that overflowed are the op's own row in the table,
    # first, not hidden under "mask" because other casts carried masks.
    preload_script(
        tmp_path / "cast_overflow.py",
        "import torch\n"
        "torch.manual_seed(0)\n"
        "w = torch.nn.Parameter(torch.randn(16, 16))\n"
        "opt = torch.optim.SGD([w], lr=0.01)\n"
        "mask = torch.zeros(8, 16).masked_fill(torch.rand(8, 16) < 0.2, float('-inf'))\n"
        "for step in range(6):\n"
        "    x = torch.randn(8, 16) * (1e5 if step == 3 else 1.0)\n"
        "    h = x.half() + mask.half()\n"
        "    loss = (h.float().clamp(min=-1e4) @ w).square().mean()\n"
        "    if torch.isfinite(loss):\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "    opt.zero_grad()\n", out)
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["dtype"]) == ("aten::_to_copy", "float16"), first
    casts = [o for o in j["ops"] if o["op"] == "aten::_to_copy" and o["phase"] == "forward"]
    assert [o["mask"] for o in casts] == [False, True], casts
    assert casts[0]["overflowed"] and j["ops"].index(casts[0]) == 0, j["ops"][:3]
    assert "aten::_to_copy" in j["mask_ops"], j["mask_ops"]
    assert j["phases"]["forward"]["nonfinite_values"] >= casts[0]["nonfinite"] > 0, j["phases"]


def test_the_inf_ops_put_in_on_their_own_leave_a_healthy_run_healthy(out, tmp_path):
    # amax and logsumexp start their maximum from -inf (a fill_ inside),
    # scaled_dot_product_attention turns a boolean mask into -inf, and
    # F.pad places its value: constants of those kernels, not data and not
    # an overflow. No finding, no step marked non-finite.
    preload_script(
        tmp_path / "kernel_constants.py",
        "import torch, torch.nn.functional as F\n"
        "model = torch.nn.Linear(8, 8)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "x = torch.randn(16, 8)\n"
        "keep = torch.ones(8, 8, dtype=torch.bool).tril()\n"
        "for step in range(4):\n"
        "    opt.zero_grad()\n"
        "    h = model(x)\n"
        "    q = h.view(1, 2, 8, 8)\n"
        "    a = F.scaled_dot_product_attention(q, q, q, attn_mask=keep)\n"
        "    p = F.max_pool1d(F.pad(h.unsqueeze(0), (1, 1), value=float('-inf')), 3, 1)\n"
        "    loss = h.amax(1).mean() + torch.logsumexp(h, 1).mean() + a.mean() + p.mean()\n"
        "    loss.backward()\n"
        "    opt.step()\n", out)
    assert [f for f in findings(out) if f["kind"] not in ("near_max", "underflow")] == []
    j = view_json(out)
    assert j["diagnosis"]["kind"] == "healthy", j["diagnosis"]
    assert j["nonfinite_steps"] == []
    assert "STEPS  ...." in run([NANHUNT, "view", out]).stdout


FINFO_MIN = SCRIPTS / "finfo_min_masks.py"


def test_masks_made_of_finfo_min_are_no_overflow_and_no_warning(out):
    # Hugging Face's models mask with torch.finfo(dtype).min, not -inf:
    # finite, but fp32's is past fp16's range (autocast's cast of it for
    # scaled_dot_product_attention gives -inf), and fp16's is 65504 itself.
    # Neither is an overflow: no origin ("run SDPA in fp32" would be wrong
    # advice), no warning, no op that "would overflow in fp16".
    r = preload_run([PYTHON, FINFO_MIN], out)
    assert r.returncode == 0, r.stderr
    assert "warning:" not in r.stderr and "first non-finite" not in r.stderr, r.stderr
    assert [f for f in findings(out) if f["kind"] != "underflow"] == []
    j = view_json(out)
    assert j["first_origin"] is None
    assert j["nonfinite_steps"] == []
    assert j["warnings"] == []
    for op in ("aten::_to_copy", "aten::add"):  # the SDPA cast, finfo.min + finfo.min
        assert op in j["mask_ops"], j["mask_ops"]
    text = run([NANHUNT, "view", out]).stdout
    assert "WOULD OVERFLOW IN FP16" not in text, text
    assert "STEPS  ......" in text


def test_a_real_overflow_next_to_finfo_min_masks_is_still_found(out):
    # The same attention, whose scores overflow fp16 in the matmul at step
    # 2: named there, after the warning of the growing queries.
    r = preload_run([PYTHON, FINFO_MIN], out, OVERFLOW="2")
    assert r.returncode == 0, r.stderr
    first = view_json(out)["first_origin"]
    assert (first["op"], first["top_op"], first["step"]) == ("aten::bmm", "aten::matmul", 2), first
    assert "warning: aten::mul (forward) reached" in r.stderr, r.stderr


VOCABULARY = SCRIPTS / "vocabulary_masks.py"


def test_masks_by_index_scatter_and_routing_are_healthy(out):
    # logits[..., banned] = -inf, logits.scatter(-1, banned, -inf),
    # logits[rows, cols] = -inf, a boolean index, nn.MultiheadAttention's
    # key_padding_mask, top-k routing over full_like(-inf): masks, each.
    # scatter was "non-finite data", baddbmm's carried mask a non-finite step.
    run_healthy(VOCABULARY, out,
                ("aten::scatter", "aten::index_put_", "aten::index_fill_", "aten::baddbmm"))


SHAPE_OPS = SCRIPTS / "masks_through_shape_ops.py"


def test_masks_moved_by_composite_and_selecting_ops_are_healthy(out):
    # Categorical(logits=masked).log_prob broadcasts the masked logits; each
    # of these was "a mask became real inf/NaN" (broadcast_tensors, hstack's
    # atleast_1d, unsafe_split, tile...): a composite op is judged by what
    # its nested ops made of the mask, and picking ops carry it.
    run_healthy(SHAPE_OPS, out, ("aten::broadcast_tensors", "aten::hstack", "aten::atleast_3d",
                                 "aten::tile", "aten::repeat_interleave", "aten::type_as",
                                 "aten::fmax", "aten::concat"))


def test_a_sum_over_a_mask_a_composite_op_moved_is_still_an_origin(out):
    r = preload_run([PYTHON, SHAPE_OPS], out, MASK_SUMMED="2")
    assert r.returncode == 0, r.stderr
    first = view_json(out)["first_origin"]
    assert (first["op"], first["step"]) == ("aten::sum", 2), first
    assert first["source"].endswith("masks_through_shape_ops.py:47 in <module>"), first["source"]
    assert "put there by a mask" in first["inputs"], first


def test_a_loss_over_a_masked_position_is_the_origin_of_its_inf(out):
    # A target that is a banned token: the loss is +inf. The op that made
    # the mask into real inf is named, and the diagnosis says it was a mask
    # (it was "healthy", with every step marked non-finite).
    r = preload_run([PYTHON, VOCABULARY], out, MASKED_TARGET="2")
    assert r.returncode == 0, r.stderr
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["top_op"], first["step"]) == (
        "aten::nll_loss_forward", "aten::cross_entropy_loss", 2), first
    assert first["source"].endswith("vocabulary_masks.py:44 in <module>"), first["source"]
    d = j["diagnosis"]
    assert d["kind"] == "mask_made_nonfinite", d
    assert "ignore_index" in " ".join(d["fixes"])
    assert j["nonfinite_steps"] == [2]
    assert "a mask's -inf (and finite inputs) gave" in run([NANHUNT, "view", out]).stdout


def padded_attention(scale_at_step_1):
    """nn.MultiheadAttention in fp16 on the CPU with a key_padding_mask, its
    inputs times `scale_at_step_1` at step 1. It adds the mask's -inf in
    baddbmm, whose CPU kernel runs an addmm_ into a copy of the mask for each
    head; the attention weights it returns are averaged over heads by a
    mean, whose fp16 kernel first casts its unwritten result buffer."""
    return (
        "import torch, torch.nn as nn\n"
        "torch.manual_seed(0)\n"
        "mha = nn.MultiheadAttention(16, 2, batch_first=True)\n"
        "for step in range(3):\n"
        f"    x = torch.randn(2, 8, 16) * ({scale_at_step_1} if step == 1 else 1.0)\n"
        "    padded = torch.zeros(2, 8, dtype=torch.bool)\n"
        "    padded[0, -2:] = True\n"
        "    with torch.autocast('cpu', dtype=torch.float16):\n"
        "        a, _ = mha(x, x, x, key_padding_mask=padded)\n"
        "    a.float().sum().backward()\n")


def test_attention_with_a_padding_mask_on_the_cpu_is_healthy(out, tmp_path):
    # The addmm_ inside baddbmm wrote -inf over memory nobody checked: it
    # left the judging to baddbmm, which carried the mask, yet counted each
    # step as non-finite (STEPS !!!); and the mean's cast of its garbage
    # was NaN "propagated" from nobody. Both are baddbmm's and mean's to
    # explain, and both explained them.
    script = tmp_path / "padded_attention.py"
    script.write_text(padded_attention(1.0))
    j = run_healthy(script, out, ("aten::baddbmm", "aten::addmm_"))
    assert [f for f in findings(out) if f["kind"] != "underflow"] == [], findings(out)
    assert "STEPS  ...\n" in run([NANHUNT, "view", out]).stdout


def test_reductions_on_the_cpu_read_no_garbage(out, tmp_path):
    # CPU fp16/bf16 mean casts its result buffer to fp32 before anything
    # wrote it: whatever the allocator left there (here a freed tensor of
    # 3e38, just like it) was "would overflow in fp16: aten::_to_copy (in
    # aten::mean) up to 3e+38". max and median squeeze_ theirs first (an
    # in-place view, checked as a write). The mean's own output is still
    # checked.
    preload_script(
        tmp_path / "half_reductions.py",
        "import torch\n"
        "for step in range(6):\n"
        "    h = torch.randn(8, 16, 64, dtype=torch.bfloat16)\n"
        "    for reduce in (torch.mean, torch.max, torch.median):\n"
        "        torch.empty(8, 64, dtype=torch.bfloat16).fill_(3e38)  # freed at once\n"
        "        reduce(h, dim=1)\n"
        "near = torch.full((8, 16, 64), 60000.0, dtype=torch.bfloat16).mean(dim=1)\n", out)
    near = findings(out, "near_max")
    assert all(f["max_abs"] < 1e6 for f in near), [(f["op"], f["max_abs"]) for f in near]
    assert "aten::mean" in {f["top_op"] or f["op"] for f in near}, near  # real values warn
    j = view_json(out)
    assert all(o["op"] != "aten::_to_copy" or o["max_abs"] < 1e6 for o in j["ops"]), j["ops"]


def test_attention_that_overflows_beside_a_padding_mask_is_an_overflow(out, tmp_path):
    # nn.MultiheadAttention adds its key_padding_mask's -inf in baddbmm:
    # -inf out of it is the mask, +inf the scores overflowing fp16 at step
    # 1. An origin there, diagnosed as the overflow it is.
    preload_script(tmp_path / "mha_overflow.py", padded_attention(400.0), out)
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["step"]) == ("aten::baddbmm", 1), first
    assert j["diagnosis"]["kind"] == "forward_overflow", j["diagnosis"]


@pytest.mark.parametrize("placement", ["where", "scalar", "masked_fill", "index"])
def test_nan_markers_the_program_skips_are_masks_and_a_mean_over_them_is_named(placement, out):
    # A per-class Dice loss marks absent classes NaN on purpose and averages
    # with torch.nanmean. It was "non-finite values came in with the data:
    # find the record", every step marked "!", of a healthy run.
    script = SCRIPTS / "nan_marked_classes.py"
    plain_and_monitored([PYTHON, script, placement, "nanmean"], out)
    j = view_json(out)
    assert j["diagnosis"]["kind"] == "healthy", j["diagnosis"]
    assert j["first_origin"] is None and j["nonfinite_steps"] == [], j["nonfinite_steps"]
    assert j["counts"] == {"origins": 0, "inputs": 0, "propagated": 0}, j["counts"]
    assert "apart from deliberate masks and NaN markers" in j["diagnosis"]["evidence"][0]
    # x.mean() does not skip them: the mean is where the NaN began.
    r = preload_run([PYTHON, script, placement, "mean"], out.parent / "mean")
    assert r.returncode == 0 and "step 0 loss nan" in r.stdout, r.stdout + r.stderr
    j = view_json(out.parent / "mean")
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["kind"], first["step"], first["top_op"]) == ("origin", 0, "aten::mean"), first
    assert "NaN put there on purpose (a marker)" in first["inputs"], first
    assert d["kind"] == "nan_marker_reached", d
    assert d["title"] == "A NaN marker reached an op that does not skip NaN: aten::mean at step 0"
    assert d["fixes"][0].startswith("skip the markers where they are reduced: torch.nanmean(x) "
                                    "instead of x.mean()"), d["fixes"]


def test_nan_marked_labels_a_loss_leaves_out_after_computing_with_them_are_named(out):
    # Missing labels stored as NaN, left out of the loss after the square:
    # the loss is finite, the square's backward makes every gradient NaN
    # (0 x NaN). It was "torch.nanmean(x) instead of aten::mm", an op of
    # the backward that only spread them.
    script = SCRIPTS / "missing_labels.py"
    r = preload_run([PYTHON, script, "masked-after"], out)
    assert r.returncode == 0 and "step 0 loss 1.7166 weights finite False" in r.stdout, \
        r.stdout + r.stderr
    j = view_json(out)
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["kind"], first["step"], first["phase"], first["forward_op"]) == \
        ("origin", 0, "backward", "aten::pow"), first
    assert first["source"].endswith("missing_labels.py:31 in <module>"), first
    assert "NaN put there on purpose (a marker)" in first["inputs"], first
    assert d["kind"] == "nan_marker_reached", d
    assert d["title"] == "NaN markers reached the gradients: the backward of aten::pow at step 0"
    assert "((pred[known] - y[known]) ** 2).mean()" in d["fixes"][1], d["fixes"]
    # Either fix trains, healthy, the markers listed as the masks they are.
    for mode in ("masked-before", "filled"):
        plain_and_monitored([PYTHON, script, mode], out.parent / mode)
        j = view_json(out.parent / mode)
        assert j["diagnosis"]["kind"] == "healthy", (mode, j["diagnosis"])
        assert j["first_origin"] is None and j["nonfinite_steps"] == [], (mode, j)
        assert "aten::masked_fill_" in j["mask_ops"], (mode, j["mask_ops"])


def test_a_nan_the_program_placed_that_a_linear_spreads_is_its_input(out, tmp_path):
    # x[0, 0] = float("nan") planted in a batch (a corrupt record, or a
    # missing value's marker) reaches the model: the linear was given it,
    # no op made it. It was "origin: aten::addmm" once NaN the program
    # places counted as markers.
    preload_script(tmp_path / "planted.py", """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    x = torch.randn(16, 8)
    if step == 2:
        x[0, 0] = float("nan")
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
""", out)
    j = view_json(out)
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["kind"], first["step"], first["phase"]) == ("input", 2, "forward"), first
    assert first["source"].endswith("planted.py:10 in <module>"), first
    assert "NaN put there on purpose (a marker)" in first["inputs"], first
    assert d["kind"] == "nonfinite_input", d
    assert any("placed by the program itself" in e for e in d["evidence"]), d["evidence"]
    assert d["fixes"][0].startswith("if the NaN marks missing values, keep them out of "), d
