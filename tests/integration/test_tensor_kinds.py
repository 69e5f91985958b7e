"""Tensors that are not plain strided real memory (nested, sparse and
complex tensors, torch.func's wrappers): monitored as what they hold,
without stopping the monitoring or changing a result."""
from conftest import PYTHON, SCRIPTS, findings, plain_and_monitored, preload_run, view_json

VALIDATION = SCRIPTS / "validation_passes.py"


def test_a_validation_pass_on_nested_tensors_keeps_monitoring_on(out):
    monitored, _ = plain_and_monitored([PYTHON, VALIDATION], out)
    assert "internal error" not in monitored.stderr, monitored.stderr
    report = view_json(out)
    assert not any("monitoring stopped" in p for p in report["problems"]), report["problems"]
    origin = report["first_origin"]
    assert (origin["op"], origin["step"]) == ("aten::mul", 3), origin
    assert "validation_passes.py:37" in origin["source"], origin
    # The fast path's ops ran, and were checked (they hold values).
    ops = {(o["op"], o["phase"]) for o in report["ops"]}
    assert ("aten::_transformer_encoder_layer_fwd", "forward") in ops, sorted(ops)
    assert report["unchecked_ops"] == [], report["unchecked_ops"]


def test_a_validation_pass_after_the_optimizer_step_is_forward(out):
    # Its first layer's ops end before the layer does, so before the layer's
    # parameters say "a forward pass": they were counted as the update.
    r = preload_run([PYTHON, VALIDATION], out)
    assert r.returncode == 0, r.stderr
    phases = {}
    for o in view_json(out)["ops"]:
        phases.setdefault(o["op"], set()).add(o["phase"])
    for op in ("aten::_transform_bias_rescale_qkv", "aten::_native_multi_head_attention",
               "aten::addmm"):
        assert "optimizer" not in phases[op], (op, phases[op])
    assert "optimizer" in phases["aten::add_"]  # SGD's update is still the update


def test_an_overflow_in_a_nested_tensor_is_an_origin_with_its_shape(out):
    plain_and_monitored([PYTHON, VALIDATION, "nested"], out)
    origin = view_json(out)["first_origin"]
    assert (origin["op"], origin["step"], origin["dtype"]) == ("aten::mul", 3, "float16"), origin
    assert "validation_passes.py:35" in origin["source"], origin
    assert origin["posinf"] == 18 and origin["elements"] == 18, origin  # 2x3 + 4x3
    # Found in the buffer that holds the components' values, inside the
    # nested tensor's mul, which is named with its shape.
    assert (origin["top_op"], origin["outputs"]) == (
        "aten::mul", "float16[18] max|x|=inf +inf=18"), origin
    outer = [f for f in findings(out, "propagated") if f["op"] == "aten::mul" and f["top_op"] == ""]
    assert outer[0]["outputs"] == "float16[2, 2..4, 3] (nested) max|x|=inf +inf=18", outer


def test_vmap_and_grad_are_checked_where_they_compute(out, tmp_path):
    script = tmp_path / "functorch.py"
    script.write_text(
        "import torch\nfrom torch.func import grad, vmap\n"
        "x = torch.full((3, 4), 300.0, dtype=torch.float16)\n"
        "print(grad(lambda r: r.sin().sum())(torch.ones(3)))\n"
        "print(vmap(lambda r: r * r)(x).float().sum().item())\n")
    r = preload_run([PYTHON, script], out)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    origin = report["first_origin"]
    assert (origin["op"], origin["posinf"]) == ("aten::mul", 12), origin
    assert "functorch.py:5" in origin["source"], origin
    # The wrappers vmap and grad hand their functions hold no values of
    # their own: nothing unread to report.
    assert report["unchecked_ops"] == [], report["unchecked_ops"]


SPARSE = SCRIPTS / "sparse_embedding_overflow.py"


def test_a_sparse_gradient_that_overflows_when_coalesced_is_the_origin(out):
    # The values of sparse tensors are read: the coalesce that sums a
    # frequent token's gradient rows is where inf begins, not the
    # optimizer's arithmetic after it ("came in with the data", before).
    plain_and_monitored([PYTHON, SPARSE], out)
    report = view_json(out)
    origin = report["first_origin"]
    assert (origin["kind"], origin["op"], origin["top_op"], origin["phase"], origin["step"]) == (
        "origin", "aten::_coalesce", "aten::coalesce", "optimizer", 2), origin
    assert origin["fp32_max_abs"] == 100000, origin  # 2000 rows of 50
    assert origin["inputs"].startswith(
        "#0 float16[100, 8] (sparse, 16000 values stored) max|x|=50"), origin
    assert origin["outputs"].startswith("float16[100, 8] (sparse, 8 values stored)"), origin
    diagnosis = report["diagnosis"]
    assert diagnosis["kind"] == "backward_overflow", diagnosis
    assert any("summed in float16" in e for e in diagnosis["evidence"]), diagnosis
    assert "nn.Embedding(..., sparse=True)" in diagnosis["fixes"][0], diagnosis
    assert report["unchecked_ops"] == [], report["unchecked_ops"]


def test_an_overflow_in_a_sparse_csr_tensor_is_found_in_its_values(out):
    r = preload_run([PYTHON, SPARSE, "csr"], out)
    assert r.returncode == 0, r.stderr
    report = view_json(out)
    origin = report["first_origin"]
    assert (origin["op"], origin["top_op"], origin["step"]) == ("aten::mul", "aten::mul", 0), origin
    assert origin["source"].endswith("sparse_embedding_overflow.py:30 in scale_csr"), origin
    outer = [f for f in findings(out, "propagated") if f["op"] == "aten::mul" and f["top_op"] == ""]
    assert outer[0]["outputs"].startswith(
        "float16[4, 4] (sparse CSR, 16 values stored) max|x|=inf +inf=16"), outer
    assert report["unchecked_ops"] == [], report["unchecked_ops"]


def test_a_complex_division_by_zero_is_the_origin_not_the_inverse_transform(out):
    # Complex tensors are checked as their real and imaginary parts: the
    # spectral division that made NaN is the origin; the inverse transform
    # it fed, once judged to make NaN from "finite" (unread) inputs, passes
    # it on.
    script = SCRIPTS / "spectral_deconvolution.py"
    monitored, _ = plain_and_monitored([PYTHON, script], out)
    assert monitored.stdout == "restored finite: False\n"
    report = view_json(out)
    origin = report["first_origin"]
    assert (origin["kind"], origin["op"], origin["dtype"]) == ("origin", "aten::div", "float32")
    assert origin["source"].endswith("spectral_deconvolution.py:15 in <module>"), origin
    assert origin["outputs"].startswith(
        "float32[4, 33] (complex64: 264 real and imaginary parts) max|x|=inf"), origin
    assert "#1 ComplexFloat[33] (complex64: 66 real and imaginary parts) max|x|=1" in (
        origin["inputs"]), origin
    assert [f["op"] for f in findings(out, "origin")] == ["aten::div"]
    c2r = [f for f in findings(out, "propagated") if f["op"] == "aten::_fft_c2r"]
    assert c2r, findings(out, "propagated")
    assert report["unchecked_ops"] == [], report["unchecked_ops"]
