"""ONNX graphs written from a model's weights, and their weight products quantized for onnxruntime's CPU.

Used where a runtime's own products are slow on a CPU: :mod:`s2s.stt.whisper_onnx_build` (Whisper's decoder) and
:mod:`s2s.llm.onnx_build` (a Llama-architecture chat model). Weights are kept as CTranslate2 and transformers keep
them, one row per output.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Union

import numpy as np

Value = Union[np.ndarray, Callable[[], np.ndarray]]  # a weight, or what reads it when it is needed


class Graph:
    """An ONNX graph under construction: nodes, float32 weights, and the weight products to quantize.

    A weight may be given as a function that reads it: the layers' weights are then read one at a time, as
    :meth:`model` writes them, and never held all at once.
    """

    def __init__(self, weights: Mapping[str, Value]) -> None:
        self.weights, self.nodes, self.initializers, self.products = weights, [], [], []  # type: ignore[var-annotated]

    def constant(self, name: str, value: Value) -> str:
        self.initializers.append((name, value))  # made a tensor in :meth:`model`, one at a time
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attributes: Any) -> Any:
        from onnx import helper

        name = f"{op}_{len(self.nodes)}"
        outputs = outputs or [name]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attributes))
        return outputs[0] if len(outputs) == 1 else outputs

    def weight(self, name: str) -> np.ndarray:
        return np.asarray(read(self.weights[name]), dtype=np.float32)

    def product(self, x: str, label: str, weight: Value, outputs: list[str] | None = None,
                quantized: bool = True) -> str:
        """``x`` times ``weight`` ([inputs, outputs]), kept as ``label``; :meth:`model` quantizes it."""
        made = self.node("MatMul", [x, self.constant(label, weight)], outputs)
        if quantized:
            self.products.append(self.nodes[-1].name)
        return made

    def linear(self, x: str, prefix: str, rows: slice = slice(None), quantized: bool = True) -> str:
        """``x`` through the layer ``prefix`` (``prefix/weight``, one row per output, and ``prefix/bias`` if there
        is one), or through its ``rows``; ``quantized``: its product is 8-bit (:meth:`model`)."""
        label = f"{prefix}[{rows.start}:{rows.stop}]"
        product = self.product(x, label + "/weight", lambda: self.weight(prefix + "/weight")[rows].T,
                               quantized=quantized)
        if prefix + "/bias" not in self.weights:
            return product
        return self.node("Add", [product, self.constant(label + "/bias", lambda: self.weight(prefix + "/bias")[rows])])

    def model(self, name: str, inputs: list[Any], outputs: list[Any]) -> Any:
        """The model, its :attr:`products` quantized as onnxruntime's dynamic quantizer does it (``quantize_dynamic``
        with unsigned 8-bit weights and a scale per output column: the same numbers, the same operators, which
        onnxruntime fuses into ``DynamicQuantizeMatMul``), written here so that the float model never exists whole:
        onnxruntime's quantizer read it back from a file (SmolLM2-135M's build from its float weights peaked at
        2.27 GB that way and took 35 s; 1.29 GB and 11 s here with the weights read first, the same model to the
        bit). A weight given as a function is read here, when its tensor is made, and dropped with it (0.77 GB)."""
        from onnx import helper, numpy_helper

        products = set(self.products)
        weights = {node.input[1] for node in self.nodes if node.name in products}
        graph = helper.make_graph(_quantized_nodes(self.nodes, products), name, inputs, outputs)
        for label, value in self.initializers:  # one tensor at a time, straight into the graph (no second copy)
            value = read(value)
            tensors = quantized_columns(value, label) if label in weights else {label: value}
            for tensor_label, tensor in tensors.items():
                graph.initializer.add().CopyFrom(numpy_helper.from_array(np.ascontiguousarray(tensor), tensor_label))
        self.initializers = []
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                       helper.make_opsetid("com.microsoft", 1)], ir_version=9)


def read(value: Value) -> np.ndarray:
    """``value``, read now if it is a function that reads it."""
    return value() if callable(value) else value


def quantized_columns(weight: np.ndarray, label: str) -> dict[str, np.ndarray]:
    """``weight`` ([inputs, outputs], float32) as unsigned 8 bits with a scale and zero point per output column,
    by onnxruntime's rules (``quantize_data``, asymmetric, the range widened to hold 0; exact on every CPU:
    onnxruntime's signed weights saturate without VNNI, its documentation), named as its quantizer names them."""
    weight = np.asarray(weight, dtype=np.float32)
    low = np.minimum(weight.min(axis=0), np.float32(0))
    high = np.maximum(weight.max(axis=0), np.float32(0))
    step = (high.astype(np.float64) - low.astype(np.float64)) / 255.0
    flat = step < np.finfo(np.float32).tiny  # an all-zero column: scale 1, zero point 0
    zero = np.where(flat, 0.0, np.round(-low / np.where(flat, 1.0, step))).astype(np.uint8)
    scale = np.where(flat, 1.0, step).astype(np.float32)
    levels = np.clip((weight / scale).round() + zero, 0, 255).astype(np.uint8)
    return dict(zip(_parts(label), (levels, scale, zero)))


def _parts(name: str) -> tuple[str, str, str]:
    """The names of a quantized value, its scale and its zero point, as onnxruntime's quantizer names them."""
    return f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"


def _quantized_nodes(nodes: list[Any], products: set[str]) -> list[Any]:
    """``nodes`` with each product ``MatMul`` made onnxruntime's dynamic 8-bit pattern: its input quantized once
    (``DynamicQuantizeLinear``, shared by the products of one input), ``MatMulInteger`` with the weight's columns,
    and the two scales multiplied back."""
    from onnx import TensorProto, helper

    made: list[Any] = []
    quantized: set[str] = set()  # the inputs quantized so far
    for node in nodes:
        if node.name not in products:
            made.append(node)
            continue
        x, weight = node.input
        (x_q, x_scale, x_zero), (w_q, w_scale, w_zero) = _parts(x), _parts(weight)
        if x not in quantized:
            quantized.add(x)
            made.append(helper.make_node("DynamicQuantizeLinear", [x], [x_q, x_scale, x_zero],
                                         name=f"{x}_QuantizeLinear"))
        name, out = node.name, node.output[0]
        made += [helper.make_node("MatMulInteger", [x_q, w_q, x_zero, w_zero], [f"{name}_integer"],
                                  name=f"{name}_quant"),
                 helper.make_node("Cast", [f"{name}_integer"], [f"{name}_cast"], name=f"{name}_cast",
                                  to=TensorProto.FLOAT),
                 helper.make_node("Mul", [x_scale, w_scale], [f"{name}_scales"], name=f"{name}_scales_mul"),
                 helper.make_node("Mul", [f"{name}_cast", f"{name}_scales"], [out], name=f"{name}_output_scale_mul")]
    return made
