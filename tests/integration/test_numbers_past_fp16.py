"""Numbers the program wrote past float16's range. An op that made values
from them (a rotary table's positions counted with torch.arange(n,
dtype=fp16)): no op grew past 65504 and no switch of nanhunt's changes a
dtype the code asks for, so the diagnosis must say so and give the code's
fix. A mask value meant as minus infinity (-1e9): -inf in float16 is what
it means, no overflow, until a row masked entirely softmaxes to NaN."""
from conftest import PYTHON, SCRIPTS, origin_of_failing_run, plain_and_monitored, view_json

SCRIPT = SCRIPTS / "long_context_rotary.py"
MASKS = SCRIPTS / "additive_mask_literal.py"


def test_rotary_positions_counted_in_float16_are_the_aranges_dtype_not_an_op_to_run_in_fp32(out):
    # It said "run aten::arange in fp32: NANHUNT_FP32_OPS=aten::arange",
    # which returns fp16 again in a model.half() model, "model.bfloat16()",
    # which counts positions exactly only to 256, and "it happened mid-run,
    # as activations grew".
    first, d = origin_of_failing_run([PYTHON, SCRIPT, "half-positions"], out,
                                     "step 2 positions 65500-65563 loss nan")
    assert (first["op"], first["phase"], first["step"], first["dtype"]) == (
        "aten::arange", "forward", 2, "float16"), first
    # Positions 65520 to 65562 round to +inf; 65504 to 65519 to 65504.
    assert (first["posinf"], first["elements"]) == (29, 65563), first
    assert first["source"].endswith("long_context_rotary.py:38 in _grow"), first
    assert (d["kind"], d["op"]) == ("forward_overflow", "aten::arange"), d
    assert d["title"] == ("Forward overflow: aten::arange was asked for float16 values past "
                          "65504 at step 2"), d["title"]
    evidence = " ".join(d["evidence"])
    assert "neither NANHUNT_FP32_OPS nor autocast changes a dtype the code asks for" in evidence
    assert "dtype=self.inv_freq.dtype" in evidence, evidence  # model.half() made it fp16
    assert "counts whole numbers exactly only up to 2048" in evidence, evidence
    assert "as activations grew" not in evidence, evidence
    assert d["fixes"][0].startswith("make it in float32 (torch.arange(n, dtype=torch.float32))"), d
    assert "long_context_rotary.py:38 in _grow" in d["fixes"][0], d["fixes"]
    assert "not bfloat16" in d["fixes"][0], d["fixes"]
    assert not any("NANHUNT_FP32_OPS=" in f or "NANHUNT_AUTOCAST_DTYPE" in f
                   for f in d["fixes"]), d["fixes"]
    # The fix: positions and angles in float32, the table cast after.
    monitored, _ = plain_and_monitored([PYTHON, SCRIPT, "float-positions"], out.parent / "fixed")
    assert "step 3 positions 128-191" in monitored.stdout, monitored.stdout
    assert "weights finite False" not in monitored.stdout, monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None


def test_a_mask_of_minus_1e9_in_float16_is_a_mask_and_a_row_masked_entirely_its_literals(out):
    # (1.0 - keep) * -1e9 over fp16 scores: torch casts -1e9 to fp16's
    # -inf. It said "first non-finite values: origin aten::_to_copy" live
    # and "Forward overflow: aten::mul", with "compute aten::mul in fp32",
    # of a healthy run.
    monitored, _ = plain_and_monitored([PYTHON, MASKS, "padded"], out)
    assert "first non-finite values" not in monitored.stderr, monitored.stderr
    j = view_json(out)
    assert j["first_origin"] is None and j["nonfinite_steps"] == [], j["first_origin"]
    assert j["diagnosis"]["kind"] == "healthy", j["diagnosis"]
    assert "aten::mul" in j["mask_ops"], j["mask_ops"]
    # A sample of padding only: its rows are -inf throughout, and their
    # softmax NaN; the mask's number is named, with a mask float16 holds.
    first, d = origin_of_failing_run([PYTHON, MASKS, "empty-sample"], out.parent / "empty",
                                     "step 1 loss nan")
    assert (first["op"], first["step"]) == ("aten::_softmax", 1), first
    assert d["kind"] == "invalid_math", d
    assert any(e.startswith("the mask's -inf was a number the program wrote past float16's "
                            "range (step 0): aten::mul made -inf of the program's 1e+09, past "
                            "float16's largest value (65504), at ") and
               "additive_mask_literal.py:31 in <module>" in e for e in d["evidence"]), d
    assert d["fixes"][0].startswith("put torch.finfo(scores.dtype).min in the masked places"), d
    # The fix: finfo.min put in place, a row masked entirely is uniform.
    monitored, _ = plain_and_monitored([PYTHON, MASKS, "finfo-min"], out.parent / "fixed")
    assert "step 1 loss nan" not in monitored.stdout, monitored.stdout
    assert view_json(out.parent / "fixed")["first_origin"] is None
