"""ONNX graphs written from a model's weights, and their weight products quantized for onnxruntime's CPU.

Used where a runtime's own products are slow on a CPU: :mod:`s2s.stt.whisper_onnx_build` (Whisper's decoder) and
:mod:`s2s.llm.onnx_build` (a Llama-architecture chat model). Weights are kept as CTranslate2 and transformers keep
them, one row per output.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


class Graph:
    """An ONNX graph under construction: nodes, float32 weights, and the weight products to quantize."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights, self.nodes, self.initializers, self.products = weights, [], [], []  # type: ignore[var-annotated]

    def constant(self, name: str, value: np.ndarray) -> str:
        self.initializers.append((name, value))  # made a tensor in :meth:`model`, one at a time
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attributes: Any) -> Any:
        from onnx import helper

        name = f"{op}_{len(self.nodes)}"
        outputs = outputs or [name]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attributes))
        return outputs[0] if len(outputs) == 1 else outputs

    def weight(self, name: str) -> np.ndarray:
        return np.asarray(self.weights[name], dtype=np.float32)

    def linear(self, x: str, prefix: str, rows: slice = slice(None)) -> str:
        """``x`` through the layer ``prefix`` (``prefix/weight``, one row per output, and ``prefix/bias`` if there
        is one), or through its ``rows``; the product is quantized by :func:`save`."""
        label = f"{prefix}[{rows.start}:{rows.stop}]"
        product = self.node("MatMul", [x, self.constant(label + "/weight", self.weight(prefix + "/weight")[rows].T)])
        self.products.append(self.nodes[-1].name)
        if prefix + "/bias" not in self.weights:
            return product
        return self.node("Add", [product, self.constant(label + "/bias", self.weight(prefix + "/bias")[rows])])

    def model(self, name: str, inputs: list[Any], outputs: list[Any]) -> Any:
        from onnx import helper, numpy_helper

        graph = helper.make_graph(self.nodes, name, inputs, outputs)
        for label, value in self.initializers:  # one tensor at a time, straight into the graph (no second copy)
            graph.initializer.add().CopyFrom(numpy_helper.from_array(np.ascontiguousarray(value), label))
        self.initializers = []
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                       helper.make_opsetid("com.microsoft", 1)], ir_version=9)


def save(make: Callable[[], tuple[Any, list[str]]], target: Path) -> None:
    """The model ``make`` builds, saved to ``target``, its weight products (the names ``make`` gives with it)
    quantized by onnxruntime's dynamic quantizer to unsigned 8 bits with a scale per output column (one per row, as
    CTranslate2 keeps them; exact on every CPU: onnxruntime's signed weights saturate without VNNI, its
    documentation). No products: saved as it is. With products, the model is dropped once written, before the
    quantizer reads it back from the file, so that its weights are in memory once: ``save`` holds the only
    reference, and protobuf frees a message's memory only with the whole message (dropping its initializers alone
    left SmolLM2-135M's build at a 2.9 GB peak; 1.9 GB without the model, the quantizer's own)."""
    import onnx

    model, products = make()
    if not products:
        onnx.save(model, str(target))
        return
    from onnxruntime.quantization import QuantType, quantize_dynamic

    plain = target.with_name(target.name + ".float.tmp")
    weights = plain.with_name(plain.name + ".data")  # a model over 2 GB of protobuf keeps its weights apart
    onnx.save(model, str(plain), save_as_external_data=True, location=weights.name)
    del model
    quantize_dynamic(str(plain), str(target), weight_type=QuantType.QUInt8, per_channel=True,
                     op_types_to_quantize=["MatMul"], nodes_to_quantize=products,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    plain.unlink()
    weights.unlink()
