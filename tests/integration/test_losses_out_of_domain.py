"""Hand-written losses that go NaN for a reason of their own, run under
the preload: each diagnosis must name that reason and its fix, not fp16's
range and not a mask's trap."""
from conftest import (NANHUNT, PYTHON, SCRIPTS, origin_of_failing_run, plain_and_monitored,
                      preload_run, run, view_json)

SCRIPT = SCRIPTS / "losses_out_of_domain.py"


def diagnosed(out, mode, first_bad_step):
    r = preload_run([PYTHON, SCRIPT, mode], out)
    assert r.returncode == 0, r.stderr
    assert f"step {first_bad_step} loss" in r.stdout and "weights finite False" in r.stdout, r.stdout
    j = view_json(out)
    return j["first_origin"], j["diagnosis"], " ".join(j["diagnosis"]["evidence"])


def test_an_acos_past_its_domain_shows_the_input_past_1_and_no_where_trap(out):
    first, d, evidence = diagnosed(out, "arcface", 2)
    assert (first["op"], first["phase"], first["step"]) == ("aten::acos", "forward", 2), first
    # Six digits would print 1.0000001 as 1, inside the domain.
    assert "max|x|=1.00000012" in first["inputs"], first["inputs"]
    assert d["kind"] == "invalid_math", d
    assert "its gradient is NaN as well" in evidence, d
    assert "torch.where or masked_fill that keeps" not in evidence, d
    assert d["fixes"][0].startswith("clamp the argument into the domain"), d["fixes"]
    monitored, _ = plain_and_monitored([PYTHON, SCRIPT, "arcface-clamped"], out.parent / "fixed")
    # Its last digits vary with the thread count; that it is finite does not.
    assert monitored.stdout.splitlines()[3].startswith("step 3 loss 13.1263"), monitored.stdout
    assert monitored.stdout.splitlines()[3].endswith("weights finite True"), monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_an_fp16_cosine_rounded_to_1_is_acoss_infinite_derivative_not_a_division(out):
    # Under fp16 autocast a cosine within 2.4e-4 of 1 is 1: acos is 0 there,
    # its derivative -1 / sqrt(1 - x^2) infinite. It said "keep the
    # denominator away from 0 ... F.normalize": the program has no division,
    # and F.normalize is what it already calls.
    first, d, evidence = diagnosed(out, "arcface-fp16", 3)
    assert (first["op"], first["phase"], first["forward_op"], first["step"]) == (
        "aten::rsqrt", "backward", "aten::acos", 2), first
    assert d["kind"] == "invalid_math", d
    assert "the derivative of aten::acos at ±1 is infinite" in evidence, d
    assert d["fixes"][0].startswith("keep the cosine inside (-1, 1) before the acos"), d["fixes"]
    assert not any("denominator" in f for f in d["fixes"]), d["fixes"]
    monitored, _ = plain_and_monitored([PYTHON, SCRIPT, "arcface-fp16-clamped"],
                                       out.parent / "fixed")
    assert monitored.stdout.splitlines()[3].endswith("weights finite True"), monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_a_std_over_one_sample_is_bessels_correction(out):
    first, d, evidence = diagnosed(out, "std", 2)
    assert (first["op"], first["step"], first["nan"]) == ("aten::std", 2, 1), first
    assert "float32[1]" in first["inputs"], first["inputs"]
    assert "Bessel's correction" in evidence, d
    assert "correction=0" in d["fixes"][0], d["fixes"]


def test_a_focal_losss_fractional_power_at_zero_is_its_derivative(out):
    first, d, evidence = diagnosed(out, "focal", 2)
    assert (first["op"], first["phase"], first["forward_op"], first["step"]) == (
        "aten::pow", "backward", "aten::pow", 2), first
    assert first["posinf"] > 0, first
    assert "the derivative of aten::pow at 0 is infinite" in evidence, d
    assert "(1 - p).clamp_min(eps) ** gamma" in d["fixes"][0], d["fixes"]


def test_a_kl_divergence_by_hand_is_x_log_x_at_zero_and_computed_with_kl_div(out):
    # p * (p.log() - logq) over a confident fp16 teacher's probabilities of
    # exactly 0. It said "clamp the argument away from 0, or stay in log
    # space: F.logsigmoid, ...", not what the term is nor F.kl_div.
    script = SCRIPTS / "distillation_kl_by_hand.py"
    r = preload_run([PYTHON, script, "by-hand"], out)
    assert r.returncode == 0 and "step 0 loss nan" in r.stdout, r.stdout + r.stderr
    j = view_json(out)
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["op"], first["step"], first["neginf"]) == ("aten::log", 0, 1526), first
    assert "distillation_kl_by_hand.py:29" in first["source"], first
    evidence = " ".join(d["evidence"])
    assert ("the next ops, aten::sub then aten::mul, multiplied it by the log's own argument: "
            "x * (log(x) - y) (a KL divergence's term) is 0 x -inf = NaN where x is 0 (float32 "
            "NaN=1526 of 1600)") in evidence, d
    assert d["fixes"][0].startswith('compute it with F.kl_div(logq, p, reduction="batchmean")')
    monitored, _ = plain_and_monitored([PYTHON, script, "kl_div"], out.parent / "fixed")
    assert "nan" not in monitored.stdout, monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_a_bce_by_hand_in_fp16_is_a_probability_rounded_to_1(out):
    first, d, evidence = diagnosed(out, "bce", 0)
    assert (first["op"], first["dtype"], first["step"]) == ("aten::log", "float16", 0), first
    assert first["neginf"] > 0, first
    assert "in float16 a probability rounds to exactly 1 from a logit of about 8.3" in evidence, d
    assert "F.binary_cross_entropy_with_logits" in d["fixes"][0], d["fixes"]
    assert "x * log(x)" not in evidence, d  # (1 - y) * log(1 - p) keeps -inf where y is 0


def test_a_log1p_of_minus_a_probability_of_1_is_kept_above_minus_1_not_clamped_at_eps(out):
    # torch.log1p(-p) where fp16's sigmoid is exactly 1. It shared log's
    # fix, "clamp the argument away from 0 (x.clamp_min(eps))": clamping
    # -p at eps makes every term log1p(eps), a loss that learns nothing.
    first, d, evidence = diagnosed(out, "bce-log1p", 0)
    assert (first["op"], first["dtype"], first["step"]) == ("aten::log1p", "float16", 0), first
    assert "log1p(x) = log(1 + x) is -inf at x = -1" in evidence, d
    assert "a logarithm of 0" not in evidence, d
    assert d["fixes"][0].startswith("keep the argument above -1: torch.log1p(-p.clamp_max(1 - eps))")
    assert "clamp_min(eps)" not in " ".join(d["fixes"]), d["fixes"]
    plain_and_monitored([PYTHON, SCRIPT, "bce-log1p-clamped"], out.parent / "fixed")
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_a_poisson_losss_stirling_term_at_zero_counts_is_its_own_and_a_negative_rate_named(out):
    # F.poisson_nll_loss(full=True) over counts with zeros takes log(0) in
    # its Stirling term and masks it: every step printed "first non-finite
    # values: origin aten::log" and the view advised finfo.min masks.
    script = SCRIPTS / "poisson_counts.py"
    for healthy in ("log-rate", "softplus"):
        monitored, _ = plain_and_monitored([PYTHON, script, healthy], out.parent / healthy)
        assert "zero counts 0 " not in monitored.stdout, monitored.stdout  # zeros in every step
        assert "first non-finite values" not in monitored.stderr, monitored.stderr
        j = view_json(out.parent / healthy)
        assert j["first_origin"] is None and j["nonfinite_steps"] == [], (healthy, j["first_origin"])
        assert j["diagnosis"]["title"].startswith("Healthy: no non-finite values"), j["diagnosis"]
    # A raw linear rate goes negative: the loss's own log(input + eps).
    first, d = origin_of_failing_run([PYTHON, script, "rate"], out, "step 0 loss nan")
    assert (first["op"], first["top_op"], first["step"]) == (
        "aten::log", "aten::poisson_nll_loss", 0), first
    assert first["nan"] > 0 and first["neginf"] == 0, first
    assert any(e.startswith("F.poisson_nll_loss(log_input=False) takes log(input + eps)")
               for e in d["evidence"]), d["evidence"]
    assert d["fixes"][0].startswith("predict the log of the rate and pass log_input=True"), d


def test_a_poisson_losss_eps_that_is_0_in_float16_is_its_precision_not_an_overflow(out):
    # model.half(), a ReLU's rate of 0: log(rate + 1e-8) is log(0) in
    # float16 and -18.4 in fp32, whose recomputation is finite (22.7 at
    # most). It said "Forward overflow: aten::poisson_nll_loss produced
    # values past fp16's 65504", and to run it in fp32.
    script = SCRIPTS / "poisson_counts.py"
    first, d = origin_of_failing_run([PYTHON, script, "half-relu"], out, "step 0 loss nan")
    assert (first["op"], first["step"], first["dtype"]) == ("aten::poisson_nll_loss", 0,
                                                           "float16"), first
    assert (d["kind"], d["op"]) == ("invalid_math", "aten::poisson_nll_loss"), d
    assert any(e.startswith("recomputed in fp32 it is finite and within float16's range")
               for e in d["evidence"]), d["evidence"]
    assert any("aten::add's 1e-08 is 0 in float16" in e for e in d["evidence"]), d["evidence"]
    assert not any("negative" in e for e in d["evidence"]), d["evidence"]
    assert d["fixes"][0].startswith(
        "give F.poisson_nll_loss an eps float16 holds: F.poisson_nll_loss(rate, target, "
        "log_input=False, eps=1e-3)"), d["fixes"]
    assert not any("NANHUNT_FP32_OPS" in f for f in d["fixes"]), d["fixes"]
    plain_and_monitored([PYTHON, script, "half-relu-eps"], out.parent / "fixed")
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_a_squashed_policys_atanh_of_a_replayed_action_of_1_is_the_inverse_tanhs(out):
    # SAC's log_prob of replayed actions stored as exactly ±1. atanh's fix
    # was acos's, "clamp the argument into the domain (x.clamp(-1 + eps, 1
    # - eps))", with "acos/asin outside [-1, 1]" as its cause.
    script = SCRIPTS / "squashed_policy.py"
    first, d = origin_of_failing_run([PYTHON, script, "replayed"], out, "step 0 loss nan")
    assert (first["op"], first["step"]) == ("aten::atanh", 0), first
    # torch.distributions' code called it, for the program's log_prob line.
    assert "_inverse (torch/distributions/transforms.py:" in first["via"], first
    evidence = " ".join(d["evidence"])
    assert "atanh is ±inf at ±1 and NaN beyond: the inverse of a tanh" in evidence, d
    assert "acos" not in evidence, d
    assert d["fixes"][0].startswith("keep the argument inside (-1, 1): x.clamp(-1 + 1e-5"), d
    plain_and_monitored([PYTHON, script, "clamped"], out.parent / "fixed")
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_a_distributions_log_of_its_scale_is_named_inside_its_method_with_the_scale_to_fix(out):
    # Normal(mean, relu(raw)).log_prob(y), validation off: log(scale) of 0
    # inside torch.distributions. The program's line writes no log; it
    # said "clamp the argument away from 0 ... F.logsigmoid".
    script = SCRIPTS / "gaussian_likelihood.py"
    r = preload_run([PYTHON, script, "relu"], out)
    assert r.returncode == 0 and "step 0 loss nan" in r.stdout, r.stdout + r.stderr
    line = f"{script}:32 in <module>"
    assert f"{line}, inside Normal.log_prob (torch/distributions/normal.py:" in r.stderr, r.stderr
    j = view_json(out)
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["op"], first["step"], first["source"]) == ("aten::log", 0, line), first
    assert first["via"].startswith("Normal.log_prob (torch/distributions/normal.py:"), first
    assert (d["kind"], d["op"]) == ("invalid_math", "aten::log"), d
    assert any(e.startswith("the op is torch.distributions' own, in Normal.log_prob")
               for e in d["evidence"]), d["evidence"]
    assert d["fixes"][0].startswith("keep the distribution's parameters inside their support"), d
    assert not any("F.logsigmoid" in f for f in d["fixes"]), d["fixes"]
    text = run([NANHUNT, "view", out]).stdout
    assert "\n          inside Normal.log_prob (torch/distributions/normal.py:" in text, text
    plain_and_monitored([PYTHON, script, "softplus"], out.parent / "fixed")
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_an_entropy_by_hand_is_x_log_x_at_zero_and_computed_from_the_logits(out):
    # -(p * p.log()): softmax probabilities of exactly 0, log(0) = -inf,
    # 0 * -inf = NaN. It said "its gradient is NaN: a torch.where or
    # masked_fill ...", of a program without either, and advised the
    # "double where".
    script = SCRIPTS / "entropy_by_hand.py"
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    assert "step 2 entropy nan" in r.stdout, r.stdout
    j = view_json(out)
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["op"], first["step"], first["neginf"]) == ("aten::log", 2, 24), first
    assert d["kind"] == "invalid_math", d
    evidence = " ".join(d["evidence"])
    assert "the next op, aten::mul, multiplied it by the log's own argument: x * log(x)" in \
        evidence, d
    assert "(float32 NaN=24 of 192)" in evidence, d
    assert "torch.where or masked_fill" not in evidence, d
    assert d["fixes"][0].startswith("compute it from the logits, in log space"), d["fixes"]
    # The fix it names: healthy, and the same entropies up to step 2.
    monitored, _ = plain_and_monitored([PYTHON, script, "logits"], out.parent / "fixed")
    assert monitored.stdout.splitlines()[:2] == r.stdout.splitlines()[:2], monitored.stdout
    assert "nan" not in monitored.stdout, monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_a_logit_of_a_hard_label_is_infinite_and_takes_an_eps(out):
    # It said only "look at the inputs ... for zeros, negative numbers or
    # huge values": torch.logit has an eps argument for this.
    first, d, evidence = diagnosed(out, "logit", 2)
    assert (first["op"], first["step"], first["posinf"]) == ("aten::logit", 2, 1), first
    assert "logit(p) = log(p / (1 - p)) is -inf at p = 0 and +inf at p = 1" in evidence, d
    assert d["fixes"][0].startswith("pass logit an eps, torch.logit(p, eps=1e-6)"), d["fixes"]
    monitored, _ = plain_and_monitored([PYTHON, SCRIPT, "logit-eps"], out.parent / "fixed")
    assert "weights finite False" not in monitored.stdout, monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None
    # Over float16 probabilities that eps is none: 1 - 1e-6 rounds to 1.
    first, d, _ = diagnosed(out.parent / "half", "logit-half", 2)
    assert (first["op"], first["dtype"], first["posinf"]) == ("aten::logit", "float16", 1), first
    assert d["fixes"][0].startswith("pass logit an eps float16 holds, torch.logit(p, eps=1e-3)"), d
    monitored, _ = plain_and_monitored([PYTHON, SCRIPT, "logit-half-eps"], out.parent / "fixed-half")
    assert "weights finite False" not in monitored.stdout, monitored.stdout
    assert view_json(out.parent / "fixed-half")["first_origin"] is None


def test_lgamma_of_a_dispersion_of_zero_is_named_with_a_positive_parametrisation(out):
    # A negative binomial likelihood by hand whose ReLU dispersion reached
    # 0: the loss is NaN (the ReLU keeps the weights finite). It said only
    # "look at the inputs".
    r = preload_run([PYTHON, SCRIPT, "nb"], out)
    assert r.returncode == 0 and "step 2 loss nan" in r.stdout, r.stdout + r.stderr
    j = view_json(out)
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["op"], first["phase"], first["step"], first["posinf"]) == (
        "aten::lgamma", "forward", 2, 2), first
    assert "lgamma is +inf at 0 and at the negative integers" in " ".join(d["evidence"]), d
    assert d["fixes"][0].startswith("keep that parameter positive and off 0: F.softplus(x)"), d
    plain_and_monitored([PYTHON, SCRIPT, "nb-softplus"], out.parent / "fixed")
    assert view_json(out.parent / "fixed")["first_origin"] is None
