"""Whisper's decoder from a CTranslate2 folder as two onnxruntime models, built once into the cache.

On a CPU whose vendor is not Intel, CTranslate2 runs its int8 products through oneDNN, whose product with a single
row (every decoder step's) reads about 5 GMAC/s on an AVX2 EPYC: a token of tiny.en took 5.7 ms, 4.1 of them the
output projection onto 51,864 tokens. onnxruntime's own 8-bit products (``DynamicQuantizeMatMul``) make the same
projection in about 1.7 ms there. :func:`build` reads the folder's ``model.bin`` (CTranslate2's layout: float32,
float16 or int8 with per-row scales) and writes:

- ``cross.onnx``: the encoder's output -> each layer's cross-attention keys (transposed) and values, in float
  (one product over every frame, as fast in float and exact);
- ``step.onnx``: tokens, their positions, a causal mask and the cache -> the logits of every given position and
  the grown cache. Its weight products are quantized as onnxruntime's dynamic quantizer does it
  (:mod:`s2s.onnx_graph`), to unsigned 8 bits with a scale per output column, as CTranslate2 keeps one per row:
  its words matched CTranslate2's on all 12 real recordings where one scale per matrix changed two. Unsigned
  weights are exact on every CPU (onnxruntime's signed ones saturate without VNNI, its documentation). The
  embedding's lookup table stays float16.

The decoding itself (Whisper's timestamp rules) is :mod:`s2s.stt.whisper_onnx`.
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from s2s.models import build_in_child, build_once, cache_root, fingerprint
from s2s.onnx_graph import Graph

OUTPUTS = ("cross.onnx", "step.onnx")
VERSION = 1  # of the build: part of the cached folder's name, so a changed build is made again
# CTranslate2's DataType ids (include/ctranslate2/types.h) -> numpy
_TYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_EPSILON = 1e-5  # Whisper's LayerNorm


def _string(file: BinaryIO) -> str:
    (size,) = struct.unpack("<H", file.read(2))
    return file.read(size)[:-1].decode()  # a trailing NUL


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """The variables of a CTranslate2 ``model.bin`` (binary version 6: Whisper and every other spec), quantized
    ones (``*/weight`` beside ``*/weight_scale``) back in float32, aliases (the tied projection) resolved."""
    variables: dict[str, np.ndarray] = {}
    with open(path, "rb") as file:
        (version,) = struct.unpack("<I", file.read(4))
        if version < 5:
            raise ValueError(f"{path}: CTranslate2 binary version {version}; expected 5 or later (convert again)")
        _string(file)  # the spec's name
        file.read(4)  # its revision
        (count,) = struct.unpack("<I", file.read(4))
        for _ in range(count):
            name = _string(file)
            (rank,) = struct.unpack("<B", file.read(1))
            shape = struct.unpack(f"<{rank}I", file.read(4 * rank))
            type_id, size = struct.unpack("<BI", file.read(5))
            variables[name] = np.frombuffer(file.read(size), _TYPES[type_id]).reshape(shape)
        (count,) = struct.unpack("<I", file.read(4))
        aliases = [(_string(file), _string(file)) for _ in range(count)]
    for name in [name for name in variables if name.endswith("/weight_scale")]:
        scale, weight = variables.pop(name).astype(np.float32), name[: -len("_scale")]
        rows = scale.reshape(-1, *[1] * (variables[weight].ndim - 1))
        variables[weight] = variables[weight].astype(np.float32) / rows
    for alias, name in aliases:  # after the scales: a tied projection is its table in float
        variables[alias] = variables[name]
    return variables


class _Graph(Graph):
    """:class:`s2s.onnx_graph.Graph` with Whisper's normalisation and heads."""

    def norm(self, x: str, prefix: str) -> str:
        return self.node("LayerNormalization", [x, self.constant(prefix + "/gamma", self.weight(prefix + "/gamma")),
                                                self.constant(prefix + "/beta", self.weight(prefix + "/beta"))],
                         axis=-1, epsilon=_EPSILON)

    def heads(self, x: str, heads: int, order: list[int]) -> str:
        """``[1, n, heads * size]`` -> its heads, transposed by ``order`` from ``[1, n, heads, size]``."""
        shape = self.constant(f"heads_{len(self.nodes)}", np.array([1, 0, heads, -1], np.int64))
        return self.node("Transpose", [self.node("Reshape", [x, shape])], perm=order)


def layers_of(weights: dict[str, np.ndarray]) -> int:
    return sum(1 for name in weights if name.startswith("decoder/layer_") and name.endswith("/ffn/linear_0/weight"))


def _cross(weights: dict[str, np.ndarray], heads: int) -> Any:
    from onnx import TensorProto, helper

    graph, width = _Graph(weights), weights["decoder/embeddings/weight"].shape[1]
    outputs = []
    for layer in range(layers_of(weights)):
        prefix = f"decoder/layer_{layer}/attention/linear_1"  # keys and values, fused
        keys = graph.linear("encoder_output", prefix, slice(0, width), quantized=False)  # float: one product over
        values = graph.linear("encoder_output", prefix, slice(width, 2 * width), quantized=False)  # every frame
        scale = graph.constant(f"scale_{layer}", np.array((width // heads) ** -0.5, np.float32))
        graph.node("Mul", [graph.heads(keys, heads, [0, 2, 3, 1]), scale], [f"cross_k_{layer}"])  # scaled once
        graph.node("Identity", [graph.heads(values, heads, [0, 2, 1, 3])], [f"cross_v_{layer}"])
        outputs += [f"cross_k_{layer}", f"cross_v_{layer}"]
    model = graph.model("cross", [helper.make_tensor_value_info("encoder_output", TensorProto.FLOAT,
                                                                [1, "frames", width])],
                        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, heads, "a", "b"])
                         for name in outputs])
    return model


def _attend(graph: _Graph, queries: str, keys_t: str, values: str) -> str:
    """Attention over the encoder's frames in plain operators: ``[1, heads, n, size]`` queries, the keys transposed
    and already scaled by ``1 / sqrt(size)`` (a scale here is fused into a product 5x slower; onnxruntime's own
    attention took 4x as long over 500 frames); the heads joined again."""
    scores = graph.node("MatMul", [queries, keys_t])
    mixed = graph.node("MatMul", [graph.node("Softmax", [scores], axis=-1), values])
    joined = graph.node("Transpose", [mixed], perm=[0, 2, 1, 3])  # [1, n, heads, size]
    return graph.node("Reshape", [joined, graph.constant(f"join_{len(graph.nodes)}", np.array([1, 0, -1], np.int64))])


def _gelu(graph: _Graph, x: str) -> str:
    """Whisper's exact GELU: x (1 + erf(x / sqrt 2)) / 2."""
    def scalar(value: float) -> str:
        return graph.constant(f"c_{len(graph.nodes)}_{value}", np.array(value, np.float32))

    erf = graph.node("Erf", [graph.node("Mul", [x, scalar(2 ** -0.5)])])
    return graph.node("Mul", [graph.node("Mul", [x, graph.node("Add", [erf, scalar(1.0)])]), scalar(0.5)])


def _step(weights: dict[str, np.ndarray], heads: int) -> Any:
    from onnx import TensorProto, helper

    graph = _Graph(weights)
    table = weights["decoder/embeddings/weight"]
    words, width = table.shape
    size = width // heads
    looked_up = graph.node("Gather", [graph.constant("embeddings", table.astype(np.float16)), "tokens"])
    x = graph.node("Add", [graph.node("Cast", [looked_up], to=TensorProto.FLOAT),
                           graph.node("Gather", [graph.constant("positions_table",
                                                                graph.weight("decoder/position_encodings/encodings")),
                                                 "positions"])])
    mask = graph.node("Unsqueeze", ["mask", graph.constant("axes", np.array([0, 1], np.int64))])
    inputs = [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "n"]),
              helper.make_tensor_value_info("positions", TensorProto.INT64, [1, "n"]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["n", "total"])]
    outputs = []
    for layer in range(layers_of(weights)):
        prefix = f"decoder/layer_{layer}"
        h = graph.norm(x, prefix + "/self_attention/layer_norm")
        parts = graph.node("Split", [graph.linear(h, prefix + "/self_attention/linear_0"),
                                     graph.constant(f"parts_{layer}", np.array([width] * 3, np.int64))],
                           [f"q_{layer}", f"k_{layer}", f"v_{layer}"], axis=-1)
        # onnxruntime's own attention with the cache: twice as fast as the same in plain operators, which copy
        # the growing cache at every step
        mixed = graph.node("MultiHeadAttention", [*parts, "", "", mask, f"past_k_{layer}", f"past_v_{layer}"],
                           [f"attended_{layer}", f"present_k_{layer}", f"present_v_{layer}"],
                           domain="com.microsoft", num_heads=heads)[0]
        x = graph.node("Add", [x, graph.linear(mixed, prefix + "/self_attention/linear_1")])
        h = graph.norm(x, prefix + "/attention/layer_norm")
        queries = graph.heads(graph.linear(h, prefix + "/attention/linear_0"), heads, [0, 2, 1, 3])
        mixed = _attend(graph, queries, f"cross_k_{layer}", f"cross_v_{layer}")
        x = graph.node("Add", [x, graph.linear(mixed, prefix + "/attention/linear_2")])
        h = _gelu(graph, graph.linear(graph.norm(x, prefix + "/ffn/layer_norm"), prefix + "/ffn/linear_0"))
        x = graph.node("Add", [x, graph.linear(h, prefix + "/ffn/linear_1")])
        inputs += [helper.make_tensor_value_info(f"past_{kind}_{layer}", TensorProto.FLOAT, [1, heads, "past", size])
                   for kind in "kv"]
        inputs += [helper.make_tensor_value_info(f"cross_k_{layer}", TensorProto.FLOAT, [1, heads, size, "frames"]),
                   helper.make_tensor_value_info(f"cross_v_{layer}", TensorProto.FLOAT, [1, heads, "frames", size])]
        outputs += [helper.make_tensor_value_info(f"present_{kind}_{layer}", TensorProto.FLOAT,
                                                  [1, heads, "total", size]) for kind in "kv"]
    x = graph.norm(x, "decoder/layer_norm")
    graph.product(x, "projection", graph.weight("decoder/projection/weight").T, ["logits"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", words])
    return graph.model("step", inputs, [logits] + outputs)


def build(folder: Path, out: Path) -> None:
    """Write :data:`OUTPUTS` into the new folder ``out`` from the CTranslate2 Whisper folder ``folder``."""
    import onnx

    weights = read_weights(folder / "model.bin")
    heads = int(weights["decoder/num_heads"])
    out.mkdir()
    for name, make in (("cross.onnx", _cross), ("step.onnx", _step)):
        onnx.save(make(weights, heads), str(out / name))


def built(folder: Path, cache_dir: str | None) -> Path:
    """The built folder for the CTranslate2 folder ``folder`` in the cache, built once by a child process (its float
    copies, 0.49 GB at the peak for tiny.en, never count in the pipeline's memory): named by the folder's
    fingerprint (an edited model is built again) and :data:`VERSION`."""
    return build_once(cache_root(cache_dir) / f"whisper-onnx-{fingerprint(folder)}-v{VERSION}",
                      lambda out: build_in_child(__name__, out, [str(folder)]),
                      f"Whisper's decoder for onnxruntime ({folder.name})")


if __name__ == "__main__":  # python -m s2s.stt.whisper_onnx_build OUT FOLDER
    build(Path(sys.argv[2]), Path(sys.argv[1]))
