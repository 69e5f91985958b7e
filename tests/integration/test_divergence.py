"""Where the values grew before the first inf/NaN. A learning rate too
high makes each update larger than the last until some op passes the
format's range: the diagnosis is the divergence, whichever op overflowed
(fp32 or bf16 for it would only postpone the NaN). A batch that exploded
while the weights stayed put is the batch's. An exp that overflowed says
where exp leaves fp16's range and what keeps its argument in it."""
from conftest import PYTHON, SCRIPTS, plain_and_monitored, view_json

SCRIPT = SCRIPTS / "diverging_learning_rate.py"


def test_a_learning_rate_too_high_is_divergence_not_a_loss_overflow(out):
    monitored, _ = plain_and_monitored([PYTHON, SCRIPT, "diverging"], out)
    assert "step 4 loss 2.39852e+16" in monitored.stdout, monitored.stdout
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["step"]) == ("aten::mse_loss", 5), first
    d = j["diagnosis"]
    # Before: "Not an fp16 overflow: aten::mse_loss made inf/NaN", with
    # "find where the values grew" naming the batch first.
    assert d["kind"] == "diverged", d
    assert d["title"] == ("Training diverged: updates grew until aten::mse_loss made "
                          "inf/NaN at step 5"), d["title"]
    [growth] = [e for e in d["evidence"] if e.startswith("the updates grew")]
    # SGD's outputs are the weights: 0.82 at step 0, tenfold and more from
    # step 2 on.
    assert "reached max|x| 0.819935 at step 0, 19.4681 at step 2, 4782.83 at step 3, " \
           "9.05e+11 at step 4." in growth, growth
    assert d["fixes"][0].startswith("lower the learning rate"), d["fixes"]
    assert "clip_grad_norm_" in d["fixes"][0], d["fixes"]
    # The live warning came two steps before the inf.
    assert any(e.startswith("nanhunt warned live that the training was diverging at step 3 ")
               and e.endswith(", 2 steps before the first inf/NaN") for e in d["evidence"]), d


def test_a_diverging_run_is_warned_live_before_its_inf(out):
    # Stopped at step 4, before the loss passes fp32's range: no inf/NaN
    # anywhere, yet the updates grew 5800-fold in three steps.
    monitored, _ = plain_and_monitored([PYTHON, SCRIPT, "diverging", "5"], out)
    assert "step 4 loss 2.39852e+16" in monitored.stdout, monitored.stdout
    assert ("nanhunt: warning: the training is diverging: the updates grew from max|x| 0.819935 "
            "at step 0 to 4782.83 at step 3, tenfold and more within three steps") in \
        monitored.stderr, monitored.stderr
    j = view_json(out)
    assert j["first_origin"] is None
    d = j["diagnosis"]
    assert d["kind"] == "diverging", d
    assert d["evidence"][0] == ("step 3: the updates grew from max|x| 0.819935 at step 0 to "
                                "4782.83 at step 3"), d["evidence"]
    assert d["fixes"][0].startswith("lower the learning rate"), d["fixes"]


def test_under_autocast_the_fp16_op_that_overflowed_first_is_no_range_problem(out):
    # The same run under fp16 autocast: a matmul passes 65504 a step
    # earlier. fp32 or bf16 for it would only postpone the NaN.
    monitored, _ = plain_and_monitored([PYTHON, SCRIPT, "autocast"], out)
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["dtype"], first["step"]) == ("aten::addmm", "float16", 4), first
    d = j["diagnosis"]
    assert (d["kind"], d["op"]) == ("diverged", "aten::addmm"), d
    assert not any("NANHUNT_FP32_OPS" in f or "bf16" in f for f in d["fixes"]), d["fixes"]


def test_a_batch_that_exploded_while_the_weights_stayed_is_the_batchs(out):
    monitored, _ = plain_and_monitored([PYTHON, SCRIPT, "batch"], out)
    assert "step 4 loss 17.0003\nstep 5 loss inf" in monitored.stdout, monitored.stdout
    d = view_json(out)["diagnosis"]
    assert d["kind"] == "invalid_math", d
    assert any(e.startswith("the updates did not grow before it: the optimizer's outputs "
                            "stayed between max|x| ") and "over steps 0-4" in e
               for e in d["evidence"]), d["evidence"]
    assert d["fixes"][0].startswith("look at the batch of step 5"), d["fixes"]


def test_a_layer_norm_over_an_exploded_batch_is_the_batchs_not_its_eps(out):
    # nn.LayerNorm (eps 1e-5) over a batch scaled by 1e30: its variance
    # passes fp32's range, NaN. It said "give the norm an eps > 0" of a
    # norm that has one, the cause of a constant row under eps=0.
    monitored, _ = plain_and_monitored([PYTHON, SCRIPT, "layernorm", "7"], out)
    assert "step 4 loss 18.4284\nstep 5 loss nan" in monitored.stdout, monitored.stdout
    j = view_json(out)
    first, d = j["first_origin"], j["diagnosis"]
    assert (first["op"], first["step"]) == ("aten::native_layer_norm", 5), first
    assert (d["kind"], d["op"]) == ("invalid_math", "aten::native_layer_norm"), d
    assert any(e.startswith("an input reached |x| = 4.09374e+30, past 1.8e19") for e in d["evidence"]), d
    assert not any("normalisation divide" in e for e in d["evidence"]), d["evidence"]
    assert d["fixes"][0].startswith("look at the batch of step 5"), d["fixes"]
    assert not any("eps > 0" in f for f in d["fixes"]), d["fixes"]


def test_an_exp_overflow_says_where_exp_leaves_fp16_and_how_to_keep_it_in(out):
    monitored, _ = plain_and_monitored([PYTHON, SCRIPTS / "vae_log_variance.py"], out)
    j = view_json(out)
    first = j["first_origin"]
    assert (first["op"], first["dtype"], first["step"]) == ("aten::exp", "float16", 1), first
    d = j["diagnosis"]
    assert (d["kind"], d["op"]) == ("forward_overflow", "aten::exp"), d
    # Before: "use a library function that subtracts the max", a softmax's
    # fix, for the exp of a log-variance.
    [exp_fix] = [f for f in d["fixes"] if f.startswith("exp passes float16's range")]
    assert exp_fix.startswith("exp passes float16's range from x = 11.09 on (here its input "
                              "reached |x| = 35.6562)"), exp_fix
    assert "logvar.clamp(max=10).exp()" in exp_fix and "F.softplus" in exp_fix, exp_fix
    assert not any("subtracts the max or accumulates" in f for f in d["fixes"]), d["fixes"]
