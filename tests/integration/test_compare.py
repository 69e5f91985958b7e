"""`nanhunt compare`: an fp32 and an fp16 run of the demo side by side name
the attention matmul as the first op whose fp16 values leave fp16's range,
with what the fp32 run says it needed."""
import json

from conftest import DEMO, NANHUNT, PYTHON, preload_run, run


def test_fp32_against_fp16_names_the_attention_matmul(tmp_path):
    fp32, fp16 = tmp_path / "fp32", tmp_path / "fp16"
    for out, dtype in ((fp32, "float32"), (fp16, "float16")):
        r = preload_run([PYTHON, DEMO, "--dtype", dtype], out)
        assert r.returncode == 0, r.stderr
    c = json.loads(run([NANHUNT, "compare", "--json", fp32, fp16]).stdout)
    assert c["first_out_of_range_a"] is None  # fp32 has no fp16 outputs
    first = c["first_out_of_range_b"]
    assert (first["op"], first["top_op"], first["phase"], first["step"]) == \
        ("aten::bmm", "aten::matmul", "forward", 26)
    assert first["max_abs"] is None  # inf in fp16
    assert first["other_dtype"] == "float32" and first["other_max_abs"] > 65504
    assert c["first_nonfinite_step_a"] is None and c["first_nonfinite_step_b"] == 26
    bmm = next(o for o in c["ops"] if (o["op"], o["phase"]) == ("aten::bmm", "forward"))
    assert bmm["a_nonfinite"] == 0 and bmm["b_nonfinite"] > 0
    text = run([NANHUNT, "compare", fp32, fp16]).stdout
    assert "B: aten::bmm (in aten::matmul)  forward  step 26" in text
    assert "fp16 cannot hold it" in text


def test_compare_needs_two_runs(tmp_path):
    r = run([NANHUNT, "compare", tmp_path])
    assert r.returncode == 2 and "usage: nanhunt compare" in r.stderr
