"""`nanhunt view` classifies a run the way an expert would. Each class is
shown by a real training script built to show it, run under the preload;
the test checks the class, the op it names and that a fix is offered."""
import re
import sqlite3

import pytest

from conftest import (DEMO, NANHUNT, PYTHON, SCRIPTS, origin_of_failing_run,
                      plain_and_monitored, preload_run, preload_script, run, view_json)

CASES = [
    # script, class, op named
    (DEMO, "forward_overflow", "aten::matmul"),
    (SCRIPTS / "backward_overflow.py", "backward_overflow", None),
    (SCRIPTS / "nan_in_batch.py", "nonfinite_input", None),
    (SCRIPTS / "oscillating_scaler.py", "skipped_steps", None),
    (SCRIPTS / "vanishing_gradients.py", "underflow", ""),
    (SCRIPTS / "healthy_training.py", "healthy", ""),
    (SCRIPTS / "log_of_zero.py", "invalid_math", "aten::log"),
    (SCRIPTS / "adam_on_fp16_weights.py", "fp16_optimizer_state", "aten::addcdiv_"),
    (SCRIPTS / "batchnorm_on_raw_features.py", "fp16_running_statistics", "aten::batch_norm"),
    (SCRIPTS / "clip_grad_norm_fp16.py", "fp16_gradient_norm", "aten::_foreach_norm"),
]


@pytest.mark.parametrize("script,kind,op", CASES, ids=[c[1] for c in CASES])
def test_each_class_from_a_script_that_shows_it(script, kind, op, out):
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    d = view_json(out)["diagnosis"]
    assert d["kind"] == kind, d
    if op is not None:
        assert d["op"] == op, d
    assert d["title"] and d["evidence"], d
    if kind != "healthy":
        assert d["fixes"], d
    text = run([NANHUNT, "view", out]).stdout
    assert f"DIAGNOSIS  {d['title'][:40]}" in text
    assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.parametrize("implementation,op,step", [
    ("foreach", "aten::_foreach_addcdiv_", 0), ("fused", "aten::_fused_adam_", 2)])
def test_foreach_and_fused_updates_are_checked_as_they_write(implementation, op, step, out):
    # They return nothing: the parameters and state they write are their
    # outputs. Unchecked, the run was 'healthy' with a NaN loss from step 1
    # (on a GPU the next forward pass read NaN "from the data").
    r = preload_run([PYTHON, SCRIPTS / "adam_on_fp16_weights.py", implementation], out)
    assert r.returncode == 0, r.stderr
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["phase"], first["step"]) == (op, "optimizer", step), first
    assert j["diagnosis"]["kind"] == "fp16_optimizer_state", j["diagnosis"]
    # An update's line is the program's opt.step() (torch.optim's own lines
    # skipped); it had none before.
    script = SCRIPTS / "adam_on_fp16_weights.py"
    line = script.read_text().splitlines().index("    opt.step()") + 1
    assert first["source"] == f"{script}:{line} in <module>", first


def test_tiny_gradients_in_bf16_are_no_underflow_but_a_forecast(out):
    # The same tiny gradients under bf16 autocast: bf16 holds them, so the
    # run is healthy (it was "Gradients underflow", advising bf16 autocast
    # to a bf16 run); what fp16 would make of them is said as evidence.
    r = preload_run([PYTHON, SCRIPTS / "vanishing_gradients.py"], out, DTYPE="bfloat16")
    assert r.returncode == 0, r.stderr
    j = view_json(out)
    assert j["diagnosis"]["kind"] == "healthy", j["diagnosis"]
    assert any("would flush to zero in fp16" in e for e in j["diagnosis"]["evidence"])
    backward = j["phases"]["backward"]
    assert backward["fp16_elements"] == 0 and backward["underflow"] > 0, backward


def test_underflow_in_a_half_model_is_no_gradscaler_advice(out):
    # model.half(): GradScaler refuses its fp16 gradients ("Attempting to
    # unscale FP16 gradients"), yet it was the first fix, and bf16 autocast
    # the second, for a model that runs no autocast.
    r = preload_run([PYTHON, SCRIPTS / "vanishing_gradients.py", "half"], out)
    assert r.returncode == 0, r.stderr
    d = view_json(out)["diagnosis"]
    assert d["kind"] == "underflow", d
    assert d["fixes"][0].startswith("scale the loss by hand, (loss * 1024).backward()"), d
    assert d["fixes"][1] == ("or train in bf16, whose range goes down to 1e-38: "
                             "model.bfloat16() instead of model.half()"), d


def test_gradients_a_gradscaler_scales_near_the_limit_are_no_warning(out, tmp_path):
    # GradScaler scales the gradients up to fp16's limit on purpose (it grows
    # its scale until they overflow, then skips that step): the run was
    # "Healthy so far: values are nearing fp16's limit" for the scaled
    # gradients, and for an fp32 value that never lives in fp16.
    preload_script(
        tmp_path / "scaled_near_the_limit.py",
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(16, 16)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=1e-4)\n"
        "scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 14)\n"
        "for step in range(4):\n"
        "    x = torch.randn(1, 16) * 0.01  # one row: the bias gradient is 3 x 16384\n"
        "    with torch.autocast('cpu', dtype=torch.float16):\n"
        "        out = model(x)\n"
        "    loss = out.float().sum() * 3  # fp16 gradients of 3 x 16384\n"
        "    big = torch.full((4,), 30000.0).sum()  # fp32, far past 16376\n"
        "    opt.zero_grad()\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n", out)
    assert any(w["phase"] == "backward" and w["dtype"] == "float16"
               for w in view_json(out)["warnings"]), "the plant must reach the threshold"
    d = view_json(out)["diagnosis"]
    assert d["title"] == "Healthy: no non-finite values, nothing close to fp16's limit", d
    evidence = " ".join(d["evidence"])
    assert "the scaled gradients came to |x| = 49152" in evidence, evidence
    assert "float32 values of aten::sum (forward) reached |x| = 120000" in evidence, evidence


def test_a_gradscaler_settling_its_scale_is_healthy_not_stalled(out, tmp_path):
    # A GradScaler that starts too high skips its first steps, halving its
    # scale at each, then trains: what it is for. With 6 of 30 steps
    # skipped that was "Stalled training" (and, under the share, "NaN
    # mid-training: gradients overflowed").
    preload_script(
        tmp_path / "settling_scaler.py",
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 24)\n"
        "x, y = torch.randn(256, 8), torch.randn(256, 1)\n"
        "for step in range(30):\n"
        "    opt.zero_grad()\n"
        "    with torch.autocast('cpu', dtype=torch.float16):\n"
        "        loss = torch.nn.functional.mse_loss(model(x).float(), y)\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n", out)
    j = view_json(out)
    assert j["skipped_steps"] and j["skipped_steps"] == list(range(len(j["skipped_steps"])))
    d = j["diagnosis"]
    assert (d["kind"], d["title"]) == (
        "healthy", "Healthy: every inf/NaN was in gradients GradScaler skipped"), d
    assert any("skipped while its scale settled" in e for e in d["evidence"]), d


def test_forward_overflow_names_the_fixes_an_expert_would_try(out):
    r = preload_run([PYTHON, DEMO], out)
    assert r.returncode == 0, r.stderr
    d = view_json(out)["diagnosis"]
    assert d["title"] == "Forward overflow: aten::matmul produced values past fp16's 65504 at step 26"
    assert any("demo/train.py:30" in e for e in d["evidence"]), d["evidence"]
    assert any("warned about from step 13" in e for e in d["evidence"]), d["evidence"]
    fixes = " ".join(d["fixes"])
    assert "NANHUNT_FP32_OPS=aten::matmul" in fixes
    assert "scale before the matmul" in fixes
    assert "bf16" in fixes


def test_a_nan_in_the_data_blames_the_data_not_an_op(out):
    r = preload_run([PYTHON, SCRIPTS / "nan_in_batch.py"], out)
    assert r.returncode == 0, r.stderr
    d = view_json(out)["diagnosis"]
    assert d["title"] == "Non-finite values came in with the data, not from an op"
    assert any("the batch of step 2" in f for f in d["fixes"]), d["fixes"]


def test_log_of_zero_in_fp32_is_not_called_an_fp16_overflow(out):
    # Telling this user to run the op in fp32 or bf16 would send them the
    # wrong way: the function itself is -inf at 0.
    r = preload_run([PYTHON, SCRIPTS / "log_of_zero.py"], out)
    assert r.returncode == 0, r.stderr
    d = view_json(out)["diagnosis"]
    assert d["title"] == ("Not an fp16 overflow: aten::log made inf/NaN from finite "
                          "inputs at step 5")
    evidence = " ".join(d["evidence"])
    assert "-inf=" in evidence and "log_of_zero.py:14" in evidence
    assert "a logarithm of 0 is -inf" in evidence
    fixes = " ".join(d["fixes"])
    assert "clamp_min(eps)" in fixes and "binary_cross_entropy_with_logits" in fixes
    assert "NANHUNT_FP32_OPS" not in fixes and "bf16" not in fixes
    assert "recomputed in fp32" not in run([NANHUNT, "view", out]).stdout


def test_a_chunk_of_prompt_only_is_a_mean_over_no_targets(out):
    # Instruction tuning masks the prompt out of the loss (-100): a chunk of
    # prompt alone leaves cross_entropy no target, and its mean is 0/0.
    r = preload_run([PYTHON, SCRIPTS / "prompt_only_chunk.py"], out)
    assert r.returncode == 0, r.stderr
    assert "step 3 loss nan" in r.stdout
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["top_op"], first["step"]) == (
        "aten::nll_loss_forward", "aten::cross_entropy_loss", 3), first
    assert "#1 target Long[32]: 32 of 32 are ignore_index (-100)" in first["inputs"], first
    d = j["diagnosis"]
    assert d["kind"] == "invalid_math", d
    assert "a mean over no targets is 0/0 = NaN" in " ".join(d["evidence"]), d["evidence"]
    assert "(labels != -100).any()" in d["fixes"][0], d["fixes"]


def test_a_program_that_skips_chunks_without_targets_is_healthy(out):
    plain_and_monitored([PYTHON, SCRIPTS / "prompt_only_chunk.py", "guarded"], out)
    j = view_json(out)
    assert j["first_origin"] is None and j["nonfinite_steps"] == [], j["first_origin"]


def test_an_overflow_the_next_op_absorbed_is_no_healthy_run(out):
    # x.pow(2) overflows, rsqrt(inf) is 0: the RMSNorm zeroes its rows and
    # the loss stays finite. Every step's inf was gone by its end, and the
    # run was "healthy: dropped", with a square root's NaN for a cause.
    r = preload_run([PYTHON, SCRIPTS / "rmsnorm_by_hand.py"], out)
    assert r.returncode == 0, r.stderr
    assert "step 2 loss 0.011201 zeroed rows 8" in r.stdout  # silently wrong
    d = view_json(out)["diagnosis"]
    assert (d["kind"], d["op"]) == ("forward_overflow", "aten::pow"), d
    evidence = " ".join(d["evidence"])
    assert "so the loss stayed finite" in evidence and "rsqrt of inf is 0" in evidence, d
    assert "negative" not in evidence, d
    assert "NANHUNT_FP32_OPS=aten::pow" in d["fixes"][0], d["fixes"]
    assert any(f.startswith("square in fp32: x.float().pow(2).mean()") for f in d["fixes"]), d
    # ...and what it says works, without code change.
    fixed = preload_run([PYTHON, SCRIPTS / "rmsnorm_by_hand.py"], out.parent / "fixed",
                        NANHUNT_FP32_OPS="aten::pow")
    assert fixed.returncode == 0, fixed.stderr
    assert "zeroed rows 8" not in fixed.stdout and "step 4" in fixed.stdout, fixed.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_a_half_models_overflowing_result_is_computed_in_fp32_in_code(out):
    # In a model.half() model a listed op returns fp16 again: pow's 440896
    # overflows there whatever computes it, and bf16 means the model's.
    r = preload_run([PYTHON, SCRIPTS / "rmsnorm_by_hand.py", "half"], out)
    assert r.returncode == 0, r.stderr
    d = view_json(out)["diagnosis"]
    assert (d["kind"], d["op"]) == ("forward_overflow", "aten::pow"), d
    assert d["fixes"][0].startswith(
        "in code, compute aten::pow and the ops that use its result in fp32"), d["fixes"]
    assert "up to 440896, do not fit" in d["fixes"][0], d["fixes"]
    assert any("model.bfloat16() instead of model.half()" in f for f in d["fixes"]), d["fixes"]
    assert not any("NANHUNT_AUTOCAST_DTYPE=bf16 now" in f for f in d["fixes"]), d["fixes"]


def test_a_where_that_masks_log_of_zero_still_has_a_nan_gradient(out):
    # torch.where(p > 0, p.log(), 0): the forward is finite, the gradient
    # is not (LogBackward's 0 / 0 at the entries where did not select).
    # The diagnosis said to clamp, not why the "safe" where was not.
    script = SCRIPTS / "where_gradient_trap.py"
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    assert "step 2 entropy 1.104210 weights finite False" in r.stdout
    d = view_json(out)["diagnosis"]
    assert (d["kind"], d["op"]) == ("invalid_math", "aten::log"), d
    assert any(e.startswith("its gradient is NaN: aten::div (backward of aten::log) gave "
                            "float32 NaN=31 of 96 at step 2") for e in d["evidence"]), d
    assert d["fixes"][0].startswith("make the input safe before aten::log"), d["fixes"]
    assert "torch.where(ok, z, 1).log()" in d["fixes"][0], d["fixes"]
    # The fix it names: healthy, and the same numbers up to the step it broke.
    monitored, _ = plain_and_monitored([PYTHON, script, "double-where"], out.parent / "fixed")
    assert "step 3 entropy 0.844348 weights finite True" in monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


def square_root_at_zero(script, out, kind):
    """Runs SCRIPT, whose first origin is SqrtBackward's division at step 2,
    diagnosed KIND as the square root's derivative at 0, no division of the
    program's. Returns (the run, the diagnosis)."""
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["phase"], first["forward_op"], first["step"]) == (
        "aten::div", "backward", "aten::sqrt", 2), first
    d = j["diagnosis"]
    assert d["kind"] == kind, d
    evidence = " ".join(d["evidence"])
    assert "the derivative of aten::sqrt at 0 is infinite" in evidence, d
    assert "a division by 0" not in evidence, d
    return r, d


def test_a_square_roots_nan_gradient_at_zero_is_its_derivative_not_a_division(out):
    # sqrt(0) = 0 is finite; SqrtBackward's grad / (2 * 0) is 0 / 0 where a
    # torch.where sent no gradient. It said "keep the denominator away
    # from 0, or mask the entries where it is 0": the mask is the trap.
    script = SCRIPTS / "pairwise_distance_sqrt.py"
    r, d = square_root_at_zero(script, out, "invalid_math")
    assert "step 2 loss 0.133976 weights finite False" in r.stdout
    assert d["fixes"][0].startswith("keep the argument off 0 before the square root"), d
    assert not any("mask the entries" in f for f in d["fixes"]), d["fixes"]
    monitored, _ = plain_and_monitored([PYTHON, script, "eps"], out.parent / "fixed")
    assert "step 3 loss 0.129299 weights finite True" in monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_a_gradient_penaltys_norm_by_hand_at_zero_is_dropped_with_the_sqrts_fix(out):
    # The -inf of SqrtBackward at a zero gradient row, which the critic's
    # ReLU backward zeroed: healthy, said as the square root's derivative.
    # Its fix was a mask's (finfo.min instead of -inf), which this run has
    # none of.
    script = SCRIPTS / "gradient_penalty_by_hand.py"
    _, d = square_root_at_zero(script, out, "healthy")
    assert "torch.linalg.vector_norm(x, dim=-1)" in d["fixes"][0], d["fixes"]
    assert "finfo" not in d["fixes"][0], d["fixes"]
    monitored, _ = plain_and_monitored([PYTHON, script, "norm"], out.parent / "fixed")
    assert view_json(out.parent / "fixed")["first_origin"] is None


def assert_no_finding(j, title):
    """The view's JSON `j` has no origin, input or propagated finding, and a
    diagnosis whose title starts with `title`."""
    assert j["first_origin"] is None, j["first_origin"]
    assert j["counts"] == {"origins": 0, "inputs": 0, "propagated": 0}, j["counts"]
    assert j["diagnosis"]["title"].startswith(title), j["diagnosis"]


@pytest.mark.parametrize("script", [
    "normalized_padding.py", "standardized_dead_feature.py", "rbf_kernel_cdist.py",
    "sinc_filterbank.py", "phase_loss_on_silence.py angle", "phase_loss_on_silence.py sgn",
    "nerf_transmittance.py", "vicreg_variance.py", "cox_survival.py"])
def test_a_backward_formulas_own_masked_zero_division_is_healthy_not_a_nan_origin(script, out):
    # F.normalize's norm backward divides 0 by 0 at each padding row, a
    # std's backward at a dead feature, cdist(z, z)'s at its diagonal
    # (x / 0, -inf in fp32), logcumsumexp's log of a zero gradient (Cox's
    # censored samples), sinc's at its 0 (then `* pi` before its
    # torch.where), a complex angle's and sign's at a silent frame's 0,
    # cumprod's at a factor of 0 (an opaque sample), std's at a dead unit
    # (VICReg's variance term, -inf / 0 in fp32), and each masks it
    # itself: every step said "first non-finite values: origin aten::div
    # (backward)", and the view "the inf/NaN made in each step were
    # dropped", advising a finfo.min mask the program has none of; sinc's
    # and angle's carried NaN, "came in with the data".
    name, *args = script.split()
    r = preload_run([PYTHON, SCRIPTS / name, *args], out)
    assert r.returncode == 0, r.stderr
    assert "weights finite False" not in r.stdout, r.stdout
    assert "first non-finite values" not in r.stderr, r.stderr
    assert_no_finding(view_json(out), "Healthy: no non-finite values")


def test_a_cox_likelihoods_logcumsumexp_backward_lowest_is_no_overflow_forecast(out):
    # logcumsumexp's backward puts the format's lowest (-3.4e38) where its
    # gradient is not > 0 and takes logcumsumexp of it: the nested
    # aten::_logcumsumexp was "would overflow in fp16 (5.19e+33x of 65504)".
    plain_and_monitored([PYTHON, SCRIPTS / "cox_survival.py"], out)
    j = view_json(out)
    assert_no_finding(j, "Healthy: no non-finite values")
    assert j["warnings"] == [], j["warnings"]


def test_ops_that_torch_keeps_finite_at_edge_values_make_no_finding(out):
    # Some 130 ops at zeros, ties, equal rows and -inf masks, a training
    # step each: those whose loss and gradient torch keeps finite (its own
    # formulas drop what they made on the way) are no finding. This found
    # a norm's of p = 3 and 0.5, a std's of a non-zero gradient (x / 0, not
    # 0 / 0), atan2's and pinv's reciprocals, each an "origin".
    script = SCRIPTS / "edge_values.py"
    plain = run([PYTHON, script])
    assert plain.returncode == 0, plain.stderr
    cases = re.findall(r"^CASE (\S+) loss_finite (\S+) grad_finite (\S+)$", plain.stdout, re.M)
    healthy = [name for name, loss, grad in cases if loss == grad == "True"]
    assert len(cases) > 130 and len(healthy) > 100, plain.stdout
    # Known: x ** y of a tensor y at x = y = 0. The base's gradient, y * x
    # ** (y - 1), is 0 * inf there, masked where y == 0 and not where 0 < y
    # < 1 (a steep point): an inf carried on to the mask cannot be told
    # from one carried past it. (The exponent's, log(0), is pow_t1's.)
    assert "pow_t" in healthy and "pow_t1" in healthy
    healthy.remove("pow_t")
    plain_and_monitored([PYTHON, script, *healthy], out)
    assert_no_finding(view_json(out), "Healthy")  # a first origin's line names its case


def test_a_learned_exponents_log_of_zero_is_torchs_own_and_its_log_of_a_negative_named(out):
    # GeM pooling's learned p over a ReLU's zeros: the gradient of p, x ** p
    # * log(x), is -inf then NaN at each zero before torch's where drops
    # it. Every step was "!" under "origin aten::log (backward)", said to
    # be pow's derivative at 0 "with an exponent below 1" (p is 3).
    script = SCRIPTS / "gem_pooling.py"
    for healthy in ("relu", "clamped"):
        plain_and_monitored([PYTHON, script, healthy], out.parent / healthy)
        j = view_json(out.parent / healthy)
        assert_no_finding(j, "Healthy: no non-finite values")
        assert j["nonfinite_steps"] == [], (healthy, j["nonfinite_steps"])
    # Without the ReLU, p = 2 keeps x ** p finite and log(x) of a negative
    # x makes p's gradient NaN: that log, with the exponent's fix, not the
    # base's (an exponent of 1 or more) nor a log's (stay in log space).
    first, d = origin_of_failing_run([PYTHON, script, "signed"], out, "step 0 loss 2.35868 p nan")
    assert (first["op"], first["phase"], first["step"], first["forward_op"]) == (
        "aten::log", "backward", 0, "aten::pow"), first
    assert d["kind"] == "invalid_math", d
    evidence = " ".join(d["evidence"])
    assert "d(x ** p)/dp = x ** p * log(x), is NaN wherever the base x is negative" in evidence, d
    assert "exponent below 1" not in evidence and "log space" not in " ".join(d["fixes"]), d
    assert d["fixes"][0].startswith("keep the base positive before a learned exponent"), d


@pytest.mark.parametrize("mode, op, evidence", [
    ("lorentz", "aten::acosh", "acosh is NaN below 1: a hyperbolic distance"),
    ("poincare", "aten::rsqrt", "the derivative of aten::acosh at 1 is infinite")])
def test_a_hyperbolic_distance_of_a_point_and_itself_is_acoshs_at_one(mode, op, evidence, out):
    # A distance matrix's diagonal, acosh of 1: rounded below 1 (NaN), or
    # exactly 1 (an infinite derivative). The first was told to clamp into
    # [-1 + eps, 1 - eps], acos's domain, where acosh is NaN everywhere; the
    # second to keep a denominator away from 0, F.normalize.
    script = SCRIPTS / "hyperbolic_distances.py"
    first, d = origin_of_failing_run([PYTHON, script, mode], out, "weights finite False")
    assert (first["op"], first["step"], d["kind"]) == (op, 0, "invalid_math"), (first, d)
    assert any(e.startswith(evidence) for e in d["evidence"]), d["evidence"]
    assert d["fixes"][0].startswith("clamp the argument at 1 + eps before the acosh"), d["fixes"]
    assert not any("1 - eps" in f or "denominator" in f for f in d["fixes"]), d["fixes"]
    # The fix, as the view gives it: healthy.
    plain_and_monitored([PYTHON, script, "clamped"], out.parent / "clamped")
    assert_no_finding(view_json(out.parent / "clamped"), "Healthy: no non-finite values")


def nan_origin_diagnosis(out, op, step, line):
    """The view of `out` names forward op `op` at `step` and `line` as the
    first origin, of one NaN. Returns its diagnosis and its evidence as
    one string."""
    j = view_json(out)
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["op"], first["phase"], first["step"], first["nan"]) == (
        op, "forward", step, 1), first
    assert line in first["source"], first
    return d, " ".join(d["evidence"])


def test_a_logdet_of_a_negative_determinant_is_named_and_its_own_left_out_nan_is_no_step(out):
    # Glow's 1x1 convolution started as a rotation of det -1: torch.logdet
    # is NaN. It was an origin with no cause and no fix but "look at the
    # inputs". And where det was +1, the NaN that torch.logdet places on
    # every call (for a negative determinant, then left out by its
    # torch.where) marked every step "!" under "every checked output was
    # finite".
    script = SCRIPTS / "invertible_conv_flow.py"
    r = preload_run([PYTHON, script, "logdet"], out)
    assert r.returncode == 0 and "step 0 loss nan" in r.stdout, r.stdout + r.stderr
    d, evidence = nan_origin_diagnosis(out, "aten::logdet", 0, "invertible_conv_flow.py:35")
    assert "torch.logdet is NaN for a matrix whose determinant is negative" in evidence, d
    assert d["fixes"][0].startswith("take log |det| with torch.linalg.slogdet(W).logabsdet"), d
    for fixed in ("slogdet", "logdet-positive"):
        plain_and_monitored([PYTHON, script, fixed], out.parent / fixed)
        j = view_json(out.parent / fixed)
        assert_no_finding(j, "Healthy: no non-finite values")
        assert j["nonfinite_steps"] == [] and j["steps"] == 4, (fixed, j["nonfinite_steps"])


@pytest.mark.parametrize("mask", ["float", "bool"])
def test_a_mean_by_hand_over_a_mask_that_selected_nothing_is_named_with_its_count_clamped(
        mask, out):
    # (nll * mask).sum() / mask.sum() over a batch of empty sequences: 0 / 0.
    # It said "keep the denominator away from 0 (x / (d + eps) ... a
    # normalisation by hand ... is F.normalize", to a masked mean.
    script = SCRIPTS / "padding_only_batch.py"
    r = preload_run([PYTHON, script, mask], out)
    assert r.returncode == 0 and "step 2 loss nan weights finite False" in r.stdout, r.stdout
    d, evidence = nan_origin_diagnosis(out, "aten::div", 2, "padding_only_batch.py:31")
    assert "it divided 0 by 0, two single numbers: a mean taken by hand, sum / count" in \
        evidence, d
    assert d["fixes"][0].startswith(
        "divide by the count clamped at 1, (loss * mask).sum() / mask.sum().clamp_min(1)"), d
    assert not any("F.normalize" in f for f in d["fixes"]), d["fixes"]
    monitored, _ = plain_and_monitored([PYTHON, script, "clamped"], out.parent / "fixed")
    assert "step 2 loss 0.0000 weights finite True" in monitored.stdout, monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


@pytest.mark.parametrize("mode, forward_op, named, fix", [
    ("eigh", "aten::_linalg_eigh", "the backward of an eigendecomposition", "Cholesky"),
    ("svd", "aten::_linalg_svd", "the backward of an SVD", "torch.linalg.svdvals")])
def test_a_decompositions_gradient_at_repeated_values_is_its_formulas_not_a_division(
        mode, forward_op, named, fix, out):
    # Whitening through eigh (or svd) of features with two dead units: its
    # backward divides by eigenvalue differences, 0 for the repeated one.
    # It said "a division by 0 ... keep the denominator away from 0 ...
    # F.normalize", to a program with no division.
    script = SCRIPTS / "zca_whitening.py"
    r = preload_run([PYTHON, script, mode], out)
    assert r.returncode == 0 and "step 0 loss" in r.stdout, r.stdout + r.stderr
    assert "weights finite False" in r.stdout, r.stdout
    j = view_json(out)
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["phase"], first["forward_op"], first["step"]) == (
        "backward", forward_op, 0), first
    evidence = " ".join(d["evidence"])
    assert named in evidence and "where two are equal" in evidence, d
    assert "a division by 0" not in evidence, d
    assert fix in d["fixes"][0], d["fixes"]
    assert not any("denominator" in f for f in d["fixes"]), d["fixes"]
    monitored, _ = plain_and_monitored([PYTHON, script, "cholesky"], out.parent / "fixed")
    assert "weights finite False" not in monitored.stdout, monitored.stdout
    assert_no_finding(view_json(out.parent / "fixed"), "Healthy: no non-finite values")


def test_values_that_grew_within_the_first_forward_pass_need_no_lower_learning_rate(out):
    # Sinkhorn's scaling vectors pass 1e30 within step 0's forward pass and
    # its backward overflows fp32. It said "clip gradients ... or a lower
    # learning rate", before any update had run.
    script = SCRIPTS / "sinkhorn_transport.py"
    r = preload_run([PYTHON, script, "scaling"], out)
    assert r.returncode == 0 and "weights finite False" in r.stdout, r.stdout + r.stderr
    d = view_json(out)["diagnosis"]
    evidence = " ".join(d["evidence"])
    assert d["kind"] == "invalid_math", d
    assert "no update came before step 0: the values grew within its forward pass" in evidence, d
    assert "sinkhorn_transport.py:38" in evidence, d
    assert d["fixes"][0].startswith("make the computation at "), d["fixes"]
    assert "torch.logsumexp" in d["fixes"][0], d["fixes"]
    assert not any("clip gradients" in f for f in d["fixes"]), d["fixes"]
    monitored, _ = plain_and_monitored([PYTHON, script, "log"], out.parent / "fixed")
    assert "step 2 loss" in monitored.stdout and "weights finite False" not in monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


@pytest.mark.parametrize("mode,fixed,top_op,clamp,line,fix", [
    ("half", "half-eps", "", "aten::clamp_min's 1e-12", 52,
     "give that op an eps float16 holds with room for the backward pass, which divides by its "
     "square (a zero vector's gradient is 1 / eps): 1e-3 (F.normalize(x, eps=1e-3)"),
    ("half-cosine", "half-cosine-eps", "aten::cosine_similarity", "aten::clamp_min_'s 1e-08", 41,
     "give F.cosine_similarity an eps float16 holds: F.cosine_similarity(x1, x2, dim=-1, "
     "eps=1e-3)"),
    ("half-cosine-loss", "half-cosine-loss-eps", "aten::cosine_embedding_loss",
     "aten::add's 1e-12", 47,
     "compute the loss from F.cosine_similarity with an eps float16 holds: cos = "
     "F.cosine_similarity(x1, x2, dim=-1, eps=1e-3)")])
def test_an_eps_that_is_0_in_float16_is_named_before_its_division(out, mode, fixed, top_op, clamp,
                                                                  line, fix):
    # model.half(): F.normalize's clamp_min(1e-12) is clamp_min(0) in
    # float16, and a padding row is 0 / 0. It said "keep the denominator
    # away from 0 ... F.normalize, which clamps the norm at eps", to a
    # program that calls F.normalize. F.cosine_similarity clamps each norm
    # at its default eps, 1e-8, with a tensor torch's C++ makes for it
    # (at::scalar_tensor), not a Python float: that clamp went unnoticed,
    # and the 0 / 0 got the same advice, to a program with no division.
    # nn.CosineEmbeddingLoss's 1e-12 is no argument: "give that op an eps"
    # could not be followed, and the loss in fp32 sends a gradient of 1e6
    # back into float16.
    script = SCRIPTS / "normalized_padding.py"
    r = preload_run([PYTHON, script, mode], out)
    assert r.returncode == 0 and "step 0 loss nan weights finite False" in r.stdout, r.stdout
    j = view_json(out)
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["op"], first["top_op"], first["phase"], first["dtype"]) == (
        "aten::div", top_op, "forward", "float16"), first
    evidence = " ".join(d["evidence"])
    assert f"an eps was 0 in float16 before it (step 0): {clamp} is 0 in float16" in evidence, d
    assert f"normalized_padding.py:{line}" in evidence, d
    assert d["fixes"][0].startswith(fix), d["fixes"]
    assert not any("which clamps the norm at eps" in f or "denominator" in f
                   for f in d["fixes"]), d["fixes"]
    monitored, _ = plain_and_monitored([PYTHON, script, fixed], out.parent / "fixed")
    assert "weights finite False" not in monitored.stdout, monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_sqrt_of_a_negative_fp16_variance_is_math_not_range(out):
    r = preload_run([PYTHON, SCRIPTS / "sqrt_of_negative_fp16.py"], out)
    assert r.returncode == 0, r.stderr
    d = view_json(out)["diagnosis"]
    assert d["kind"] == "invalid_math" and d["op"] == "aten::sqrt", d
    evidence = " ".join(d["evidence"])
    assert "recomputed in fp32 it is not finite either" in evidence
    assert "E[x^2] - E[x]^2" in evidence
    assert "torch.var" in " ".join(d["fixes"])


def test_a_zero_initialised_weight_under_weight_norm_is_named_with_its_scale_to_zero(out):
    # v / |v| of a zeroed weight: 0 / 0. It had no cause and no fix but
    # "look at the inputs".
    script = SCRIPTS / "weight_norm_zero_init.py"
    first, d = origin_of_failing_run([PYTHON, script, "zeroed-weight"], out, "step 0 loss nan")
    assert (first["op"], first["step"], d["kind"]) == (
        "aten::_weight_norm_interface", 0, "invalid_math"), (first, d)
    assert any(e.startswith("weight normalisation, w = g * v / |v|") for e in d["evidence"]), d
    assert d["fixes"][0].startswith("give v non-zero values and zero the scale g"), d["fixes"]
    plain_and_monitored([PYTHON, script, "zeroed-scale"], out.parent / "fixed")
    assert_no_finding(view_json(out.parent / "fixed"), "Healthy")


@pytest.mark.parametrize("mode,op,cause", [
    ("layer", "aten::native_layer_norm", "layer and group normalisation divide"),
    ("group", "aten::native_group_norm", "layer and group normalisation divide"),
    ("rms", "aten::rsqrt", "RMS normalisation divides")])
def test_a_norm_with_eps_zero_over_a_padding_row_is_named_with_its_eps(out, mode, op, cause):
    # nn.Embedding(padding_idx=0)'s row of zeros, normalised with eps=0:
    # 1 / sqrt(0) and 0 * inf. The loss leaves the padded positions out, so
    # the first loss is finite and the gradients are not. It was "look at
    # the inputs" (rms: "keep the denominator away from 0").
    script = SCRIPTS / "normalization_eps_zero.py"
    first, d = origin_of_failing_run([PYTHON, script, mode], out, "step 1 loss nan")
    assert (first["op"], first["step"], d["kind"]) == (op, 0, "invalid_math"), (first, d)
    assert any(e.startswith(cause) for e in d["evidence"]), d["evidence"]
    assert not any(e.startswith("a division by 0") for e in d["evidence"]), d["evidence"]
    assert d["fixes"][0].startswith("give the norm an eps > 0"), d["fixes"]
    plain_and_monitored([PYTHON, script, "default"], out.parent / "default")
    assert_no_finding(view_json(out.parent / "default"), "Healthy")


def test_an_rsqrt_of_a_negative_variance_by_hand_is_a_square_roots_not_a_division(out):
    # A layer norm by hand, E[h^2] - E[h]^2 + eps, negative in rows of a
    # large offset: rsqrt's NaN. It was "a division by 0 ... keep the
    # denominator away from 0 (x / (d + eps)", which the program does.
    script = SCRIPTS / "layer_norm_by_hand.py"
    _, d = origin_of_failing_run([PYTHON, script, "by-hand"], out, "step 0 loss nan")
    assert (d["kind"], d["op"]) == ("invalid_math", "aten::rsqrt"), d
    assert any("E[x^2] - E[x]^2 can come out negative" in e for e in d["evidence"]), d
    assert not any(e.startswith("a division by 0") for e in d["evidence"]), d["evidence"]
    assert "torch.var" in d["fixes"][0] and "denominator" not in d["fixes"][0], d["fixes"]
    plain_and_monitored([PYTHON, script, "var"], out.parent / "var")
    assert_no_finding(view_json(out.parent / "var"), "Healthy")


@pytest.mark.parametrize("mode,weights,statistic", [
    ("dropped", True, True), ("leak", False, True), ("buffer", True, False),
    ("kept", True, True), ("checked", True, True)])
def test_inf_nan_dropped_within_each_step_is_healthy_and_only_then(out, mode, weights, statistic):
    # A softmax over fully masked rows is NaN every step. Zeroed right after
    # (its backward's NaN zeroed by masked_fill's backward), it never reaches
    # a weight: healthy, with the origin still named. The same NaN in the
    # weights, in a running statistic, or in a tensor still referenced at
    # the step's end is no such case. A loop that checks its loss between
    # backward and the optimizer step (checked) began a step there, and its
    # NaN gradients then read as updates the program skipped.
    r = preload_run([PYTHON, SCRIPTS / "padded_attention_by_hand.py", mode], out)
    assert r.returncode == 0, r.stderr
    assert f"weights finite {weights}, statistic finite {statistic}" in r.stdout
    j = view_json(out)
    d = j["diagnosis"]
    first = j["first_origin"]
    assert (first["op"], first["step"]) == ("aten::_softmax", 0), first
    if mode in ("dropped", "checked"):
        assert j["steps"] == 4 and j["skipped_steps"] == [], j
        assert d["kind"] == "healthy", d
        assert d["title"].startswith("Healthy: the inf/NaN made in each step were dropped"), d
        assert any("every position masked" in e for e in d["evidence"]), d
        assert any("in 4 of 4 steps" in e for e in d["evidence"]), d
    else:
        assert d["kind"] == "invalid_math", d


def test_flash_attentions_fp32_log_sum_exp_is_a_forecast_not_an_fp16_warning(out, tmp_path):
    # CPU flash attention returns its fp16 output and an fp32 log-sum-exp of
    # the scores. Scores of |q.k| ~ 3e5 put the log-sum-exp far past 65504
    # while the fp16 output stays below 4: the run read "fp16 outputs nearing
    # 65504 ... 4.9x" (an fp16 finding holding the fp32 value), and
    # NANHUNT_FP32_OPS=auto switched attention to fp32, which helps nothing.
    r = preload_script(
        tmp_path / "flash_attention_scores.py",
        "import torch\n"
        "import torch.nn.functional as F\n"
        "torch.manual_seed(0)\n"
        "for step in range(3):\n"
        "    q = (torch.randn(2, 2, 8, 8) * 300).half()\n"
        "    k = (torch.randn(2, 2, 8, 8) * 300).half()\n"
        "    v = torch.randn(2, 2, 8, 8).half()\n"
        "    print(F.scaled_dot_product_attention(q, k, v).abs().max().item())\n",
        out, NANHUNT_FP32_OPS="auto")
    assert "now run" not in r.stderr and "warning:" not in r.stderr, r.stderr
    assert not list(out.glob("*.fp32-policy"))
    flash = "aten::_scaled_dot_product_flash_attention_for_cpu"
    warnings = [w for w in view_json(out)["warnings"] if w["op"] == flash]
    assert warnings and all(w["dtype"] == "float32" for w in warnings), warnings
    assert max(w["max_abs"] for w in warnings) > 65504
    d = view_json(out)["diagnosis"]
    assert d["title"] == "Healthy: no non-finite values, nothing close to fp16's limit", d
    assert (f"float32 values of {flash} in aten::scaled_dot_product_attention (forward) reached"
            in " ".join(d["evidence"])), d
    text = run([NANHUNT, "view", out]).stdout
    assert "WARNINGS BEFORE OVERFLOW" not in text, text
    # The long label is shortened, never its phase and dtype.
    assert "forward float32\n    up to " in text, text


def test_batch_norms_running_variance_is_checked_where_it_is_written(out, tmp_path):
    # native_batch_norm updates its running statistics in place, though its
    # schema does not say so, and returns finite values: the overflow went
    # unseen (the run was "healthy"; a later read of the buffer was blamed
    # on the data). Checking them changes nothing the program computes.
    script = SCRIPTS / "batchnorm_on_raw_features.py"
    monitored, _ = plain_and_monitored([PYTHON, script], out)
    assert "running_var [127.0, inf, 0.480224609375]" in monitored.stdout
    first = view_json(out)["first_origin"]
    assert (first["op"], first["top_op"], first["phase"], first["step"]) == (
        "aten::native_batch_norm", "aten::batch_norm", "forward", 0), first
    assert "float16[3] (running_var, updated in place) max|x|=inf +inf=1" in first["outputs"]
    line = script.read_text().splitlines().index(
        "    loss = (model(x).float() - y.float()).pow(2).mean()") + 1
    assert first["source"] == f"{script}:{line} in <module>", first
    # The first fix: batch norm kept in fp32 under an fp16 model.
    fixed = preload_run([PYTHON, script, "fp32-bn"], tmp_path / "fixed")
    assert fixed.returncode == 0, fixed.stderr
    j = view_json(tmp_path / "fixed")
    assert j["first_origin"] is None and j["diagnosis"]["kind"] != "fp16_running_statistics", j


def test_a_running_variance_loaded_with_the_model_is_not_blamed_on_the_data(out, tmp_path):
    # Evaluating a checkpoint saved after its running_var overflowed: the
    # nested native_batch_norm left the inf to batch_norm around it, which
    # returns none, and the run was "healthy" with inf counted in the table.
    script, checkpoint = SCRIPTS / "batchnorm_on_raw_features.py", tmp_path / "model.pt"
    assert run([PYTHON, script, "save", checkpoint]).returncode == 0
    plain_and_monitored([PYTHON, script, "evaluate", checkpoint], out)
    j = view_json(out)
    first = j["first_origin"]
    assert (first["kind"], first["op"], first["top_op"]) == (
        "input", "aten::native_batch_norm", "aten::batch_norm"), first
    d = j["diagnosis"]
    assert d["kind"] == "nonfinite_input", d
    assert d["title"] == (
        "Non-finite values came in with the model: batch norm's running_var held inf/NaN"), d
    assert "#4 float16[3] (running_var) max|x|=inf +inf=1" in " ".join(d["evidence"]), d
    assert d["fixes"][0].startswith("to repair the model: reset_running_stats()"), d


@pytest.mark.parametrize("foreach", [False, True], ids=["per-tensor", "foreach"])
@pytest.mark.parametrize("planted,title,named,op,evidence", [
    ("nan-weight", "The model's parameters brought NaN, not the data", "parameter 2.weight",
     "aten::linear", "read parameter 2.weight, whose inf/NaN no op of this run had made"),
    ("inf-adam", "The optimizer's state brought inf, not the data",
     "Adam state exp_avg_sq of 2.weight", "aten::mul_",
     "read Adam state exp_avg_sq of 2.weight, whose inf/NaN no op of this run had made"),
    ("nan-weight-fp16", "The model's parameters were loaded with NaN; the data is not to blame",
     "copied into parameter 2.weight", "aten::copy_",
     "copied inf/NaN into parameter 2.weight from a tensor no op of this run had made"),
], ids=["weight", "adam-state", "fp16-weight"])
def test_a_checkpoint_that_diverged_is_blamed_not_the_first_batch(
        planted, title, named, op, evidence, foreach, out, tmp_path):
    # Resumed from a checkpoint saved after its run diverged, the first
    # forward pass (or update) reads inf/NaN no op made: it was "came in
    # with the data", and the user searched a healthy dataset. A checkpoint
    # saved in fp16 is converted by load_state_dict's copy_, which is
    # checked: the copy is named, by the parameter it wrote.
    script, checkpoint = SCRIPTS / "resume_from_diverged_checkpoint.py", tmp_path / "ckpt.pt"
    assert run([PYTHON, script, "save-" + planted, checkpoint]).returncode == 0
    monitored, _ = plain_and_monitored(
        [PYTHON, script, "resume", checkpoint, *(["foreach"] if foreach else [])], out)
    # Said as it happens, before anyone searches the dataset.
    held = named if named.startswith("copied into") else f"in {named}"
    assert f"first non-finite values: input of {op} (" in monitored.stderr, monitored.stderr
    assert f"at step 0, {held} — " in monitored.stderr, monitored.stderr
    j = view_json(out)
    first = j["first_origin"]
    assert (first["kind"], first["op"], first["step"]) == ("input", op, 0), first
    assert f"({named})" in first["inputs"], first
    d = j["diagnosis"]
    assert (d["kind"], d["title"]) == ("nonfinite_input", title), d
    assert evidence in d["evidence"][0], d
    fixes = " ".join(d["fixes"])
    assert "resume from an earlier checkpoint" in fixes and "guard saving" in fixes, d
    assert "batch" not in d["fixes"][0], d
    text = run([NANHUNT, "view", out]).stdout
    assert f"DIAGNOSIS  {title}" in text
    # The step guard read the loaded optimizer state before the first
    # update: what names it on a GPU, where an update's inputs go unread.
    (trace,) = sorted(out.glob("*.sqlite"))
    loaded = sqlite3.connect(trace).execute(
        "SELECT value FROM meta WHERE key = 'loaded_optimizer_state_nonfinite'").fetchall()
    assert loaded == ([("1",)] if planted == "inf-adam" else []), loaded
    # Copied into the model's own tensors (no assign): nothing read after loading.
    assert not sqlite3.connect(trace).execute(
        "SELECT value FROM meta WHERE key = 'loaded_model_tensors_nonfinite'").fetchall()
    # The name came from a walk of Python's objects, which the trace counts.
    (lookups,) = sqlite3.connect(trace).execute(
        "SELECT value FROM meta WHERE key = 'model_tensor_lookups'").fetchone()
    assert int(lookups) >= 1, lookups


def test_an_intermediate_inside_an_op_is_no_model_tensor_to_name(out):
    # fp16 mse_loss squares inside its kernel (90000: inf), then takes their
    # mean through a nested aten::mean: memory no checked op wrote. Its
    # input finding is mse_loss's to make (an origin: its own inputs are
    # finite), yet each step walked Python's objects to name that buffer,
    # about 50 ms a walk, spending the run's 16 walks on nothing (and
    # showing 8,000 us of host time an op in a five-step run).
    r = preload_run([PYTHON, SCRIPTS / "half_model_loss_overflow.py"], out)
    assert r.returncode == 0, r.stderr
    first = view_json(out)["first_origin"]
    assert (first["kind"], first["op"], first["step"]) == ("origin", "aten::mse_loss", 0), first
    (trace,) = sorted(out.glob("*.sqlite"))
    (lookups,) = sqlite3.connect(trace).execute(
        "SELECT value FROM meta WHERE key = 'model_tensor_lookups'").fetchone()
    assert lookups == "0"


def test_a_model_assigned_a_diverged_checkpoint_is_read_where_it_was_loaded(out, tmp_path):
    # load_state_dict(..., assign=True), as after building a model on the
    # meta device: the parameters are the loaded tensors, which no op
    # wrote. On a GPU nothing would read them before the first forward
    # pass's matmul, whose check reads what it wrote: it was the NaN's
    # origin. The step guard's load_state_dict wrapper reads what a model
    # was assigned and tells nanhunt, named; the meta counts what it found
    # (here on the CPU, where the linear's input is read as well, so the
    # verdict is the same either way, and the run still bit-identical).
    script, checkpoint = SCRIPTS / "resume_from_diverged_checkpoint.py", tmp_path / "ckpt.pt"
    assert run([PYTHON, script, "save-nan-weight", checkpoint]).returncode == 0
    plain_and_monitored([PYTHON, script, "resume", checkpoint, "assign"], out)
    first = view_json(out)["first_origin"]
    assert (first["kind"], first["op"], first["step"]) == ("input", "aten::linear", 0), first
    assert "(parameter 2.weight)" in first["inputs"], first
    (trace,) = sorted(out.glob("*.sqlite"))
    loaded = dict(sqlite3.connect(trace).execute(
        "SELECT key, value FROM meta WHERE key LIKE 'loaded_%'").fetchall())
    assert loaded == {"loaded_model_tensors_nonfinite": "1"}, loaded


def test_an_fp16_gradient_norm_that_overflowed_is_blamed_on_the_clipping(out, tmp_path):
    # Each gradient finite, their norm not: clip_grad_norm_ zeroed them all
    # and the loss stayed put. The diagnosis said "NaN mid-training:
    # gradients overflowed", "called in the backward pass", and advised
    # clipping gradients, the very thing that overflowed.
    script = SCRIPTS / "clip_grad_norm_fp16.py"
    monitored, _ = plain_and_monitored([PYTHON, script], out)
    assert [l.split()[2] for l in monitored.stdout.splitlines()] == ["28374.6"] * 4
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["top_op"], first["phase"], first["step"]) == (
        "aten::linalg_vector_norm", "aten::_foreach_norm", "optimizer", 0), first
    line = script.read_text().splitlines().index(
        "        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=1.0 * scale)") + 1
    assert first["source"] == f"{script}:{line} in <module>", first
    d = j["diagnosis"]
    assert "clipping by it scales every gradient to 0" in d["title"], d
    assert not any(f.startswith("clip gradients") for f in d["fixes"]), d
    # The second fix, the norm taken in fp32: the loss falls, nothing to report.
    fixed = preload_run([PYTHON, script, "fp32-norm"], tmp_path / "fixed")
    assert fixed.returncode == 0, fixed.stderr
    losses = [float(l.split()[2]) for l in fixed.stdout.splitlines()]
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 100, losses
    assert view_json(tmp_path / "fixed")["first_origin"] is None
