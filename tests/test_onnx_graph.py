"""s2s/onnx_graph.py writes its 8-bit weight products itself: the same numbers and operators as onnxruntime's own
dynamic quantizer (``quantize_dynamic``, unsigned weights, a scale per output column), checked against it."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from s2s.onnx_graph import Graph


def weights() -> dict[str, np.ndarray]:
    """Two layers ([outputs, inputs], one row per output) with the columns that test the rules: all zero, all
    positive, all negative, one tiny value, and values half-way between two levels (rounded to even)."""
    rng = np.random.default_rng(7)
    first = rng.standard_normal((6, 8)).astype(np.float32)
    first[0] = 0.0
    first[1] = np.abs(first[1]) + 0.5
    first[2] = -np.abs(first[2]) - 0.5
    first[3] = 0.0
    first[3, 4] = 1e-30
    first[4] = [0.0, 15.9375, 0.03125, 0.09375, 0.15625, 0.21875, 1.0, 2.0]  # scale 1/16: 0.5, 1.5, 2.5, 3.5 levels
    return {"a/weight": first, "b/weight": rng.standard_normal((5, 6)).astype(np.float32),
            "b/bias": rng.standard_normal(5).astype(np.float32)}


def built(quantized: bool = True, given: dict | None = None, described=lambda: None) -> onnx.ModelProto:
    graph = Graph(weights() if given is None else given)
    hidden = graph.linear("x", "a", quantized=quantized)
    graph.node("Identity", [graph.linear(graph.node("Relu", [hidden]), "b", quantized=quantized)], ["y"])
    described()
    return graph.model("tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", 5])])


def tensors(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_the_products_are_onnxruntimes_own_quantization(tmp_path):
    plain = built(quantized=False)
    onnx.save(plain, str(tmp_path / "float.onnx"))
    products = [node.name for node in plain.graph.node if node.op_type == "MatMul"]
    quantize_dynamic(str(tmp_path / "float.onnx"), str(tmp_path / "theirs.onnx"), weight_type=QuantType.QUInt8,
                     per_channel=True, op_types_to_quantize=["MatMul"], nodes_to_quantize=products,
                     extra_options={"DefaultTensorType": TensorProto.FLOAT})
    theirs, ours = onnx.load(str(tmp_path / "theirs.onnx")), built()

    expected, made = tensors(theirs), tensors(ours)
    assert set(made) == set(expected)
    for name, value in expected.items():
        assert made[name].dtype == value.dtype and np.array_equal(made[name], value), name
    assert sorted(node.op_type for node in ours.graph.node) == sorted(node.op_type for node in theirs.graph.node)

    x = np.random.default_rng(1).standard_normal((1, 3, 8)).astype(np.float32)
    assert np.array_equal(run(ours, x), run(theirs, x))  # to the bit
    exact = run(plain, x)
    assert np.abs(run(ours, x) - exact).max() < 0.02 * np.abs(exact).max()  # and near the float model (0.5 %)


def test_weights_given_as_readers_are_read_as_the_model_is_written_and_make_the_same_model():
    """llm=onnx's build reads each float weight as its tensor is written (s2s/llm/onnx_build.py's read_source), so
    a model's float weights are never all in memory."""
    reads: list[str] = []

    def reader(name, value):
        def read():
            reads.append(name)
            return value
        return read

    def described():
        assert not reads  # describing the graph reads nothing

    lazy = built(given={name: reader(name, value) for name, value in weights().items()}, described=described)
    assert sorted(reads) == ["a/weight", "b/bias", "b/weight"]  # each once, when its tensor was made
    assert lazy.SerializeToString() == built().SerializeToString()
