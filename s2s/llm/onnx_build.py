"""python -m s2s.llm.onnx_build OUT (--packaged [--cache-dir DIR] | --source FOLDER)

A transformers chat model of the Llama family (``llama``, ``qwen2``) written as one onnxruntime model, its weight
products 8-bit, for llm=onnx (:mod:`s2s.llm.onnx_lm`). llm=onnx runs this once per model in a child process: the
packaged SmolLM2 is first turned from its GGUF into float32 safetensors (:mod:`s2s.llm.gguf_convert`, a tensor at
a time), and the tokenizer is saved by transformers, as for CTranslate2 (:mod:`s2s.llm.ctranslate2_convert`).

``model.onnx`` takes the new tokens and the cache (each layer's keys and values so far) and gives the logits of the
last position and the grown cache. Each layer is onnxruntime's ``GroupQueryAttention`` (the rotary embedding,
grouped heads, the causal mask and the cache in one operator) between products whose weights are quantized as
:meth:`s2s.onnx_graph.Graph.model` says; the normalisations are ``SimplifiedLayerNormalization`` (RMS); the embedding's
table stays float16, and the output projection reads the same weights quantized.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from s2s.onnx_graph import Graph, Value, read

FAMILIES = ("llama", "qwen2")  # transformers' model_type: the layers written below (qwen2 adds biases to q, k, v)
MODEL = "model.onnx"
VERSION = 1  # of the build: part of the cached folder's name, so a changed build is made again


def read_source(folder: Path) -> tuple[dict[str, Any], dict[str, Value]]:
    """config.json and, for each weight of every ``*.safetensors`` file in ``folder``, what reads it in float32
    when the graph writes it: the float model is never in memory whole (SmolLM2-135M's build peaked at 1.10 GB
    with its 0.54 GB of float weights read first, 0.77 GB so; the same file)."""
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") not in FAMILIES:
        raise ValueError(f"{folder}: model_type {config.get('model_type')!r}; llm=onnx writes {', '.join(FAMILIES)}")
    weights: dict[str, Value] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as file:
            weights.update({name: partial(_tensor, path, name) for name in file.keys()})
    return config, weights


def _tensor(path: Path, name: str) -> np.ndarray:
    """The weight ``name`` of the safetensors file ``path``, in float32."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as file:
        return file.get_tensor(name).astype(np.float32, copy=False)


def _layers(config: dict[str, Any], weights: dict[str, Value]) -> dict[str, Value]:
    """transformers' names as the graph reads them (one row per output, q, k and v fused)."""
    named = {"norm/gamma": weights["model.norm.weight"], "embeddings": weights["model.embed_tokens.weight"],
             "projection/weight": weights.get("lm_head.weight", weights["model.embed_tokens.weight"])}
    for layer in range(config["num_hidden_layers"]):
        source, target = f"model.layers.{layer}", f"layer_{layer}"
        for kind in ("weight", "bias"):
            parts = [weights.get(f"{source}.self_attn.{part}_proj.{kind}") for part in "qkv"]
            if all(part is not None for part in parts):
                named[f"{target}/qkv/{kind}"] = partial(_joined, parts)
        named[f"{target}/out/weight"] = weights[f"{source}.self_attn.o_proj.weight"]
        for part in ("gate", "up", "down"):
            named[f"{target}/{part}/weight"] = weights[f"{source}.mlp.{part}_proj.weight"]
        named[f"{target}/attention_norm"] = weights[f"{source}.input_layernorm.weight"]
        named[f"{target}/ffn_norm"] = weights[f"{source}.post_attention_layernorm.weight"]
    return named


def _joined(parts: list[Value]) -> np.ndarray:
    return np.concatenate([read(part) for part in parts])


def head_size(config: dict[str, Any]) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def rotary_tables(config: dict[str, Any], size: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of each position's angles (half a head each), the default rotary embedding."""
    parameters = config.get("rope_parameters") or {}
    if parameters.get("rope_type", "default") != "default" or config.get("rope_scaling"):
        raise ValueError(f"rotary scaling {parameters.get('rope_type') or config.get('rope_scaling')}: llm=onnx "
                         "writes the default rotary embedding only")
    base = float(parameters.get("rope_theta") or config.get("rope_theta") or 10000.0)
    angles = np.outer(np.arange(config.get("max_position_embeddings", 8192)),
                      1.0 / base ** (np.arange(0, size, 2, dtype=np.float64) / size))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def graph(config: dict[str, Any], weights: dict[str, Value]) -> Any:
    """The model: ``tokens`` [1, n], ``seqlens_k`` [1] (int32: tokens so far, these included, less one),
    ``total_length`` (int32) and each layer's ``past_k_<i>`` / ``past_v_<i>`` [1, kv heads, past, head size] ->
    ``logits`` [1, 1, vocabulary] of the last token, and ``present_k_<i>`` / ``present_v_<i>``."""
    from onnx import TensorProto, helper

    built = Graph(_layers(config, weights))
    heads, groups = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    size = head_size(config)
    epsilon = float(config.get("rms_norm_eps", 1e-6))
    cos, sin = (built.constant(name, table) for name, table in zip(("cos", "sin"), rotary_tables(config, size)))

    def norm(x: str, name: str) -> str:
        return built.node("SimplifiedLayerNormalization", [x, built.constant(name, built.weight(name))], axis=-1,
                          epsilon=epsilon)

    table = built.weight("embeddings")
    x = built.node("Cast", [built.node("Gather", [built.constant("table", table.astype(np.float16)), "tokens"])],
                   to=TensorProto.FLOAT)
    inputs = [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "n"]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total_length", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, table.shape[0]])]
    for layer in range(config["num_hidden_layers"]):
        name = f"layer_{layer}"
        mixed = built.node("GroupQueryAttention",
                           [built.linear(norm(x, f"{name}/attention_norm"), f"{name}/qkv"), "", "", f"past_k_{layer}",
                            f"past_v_{layer}", "seqlens_k", "total_length", cos, sin],
                           [f"attended_{layer}", f"present_k_{layer}", f"present_v_{layer}"], domain="com.microsoft",
                           num_heads=heads, kv_num_heads=groups, do_rotary=1, rotary_interleaved=0)[0]
        x = built.node("Add", [x, built.linear(mixed, f"{name}/out")])
        h = norm(x, f"{name}/ffn_norm")
        gate = built.linear(h, f"{name}/gate")
        swished = built.node("Mul", [gate, built.node("Sigmoid", [gate])])  # SiLU
        x = built.node("Add", [x, built.linear(built.node("Mul", [swished, built.linear(h, f"{name}/up")]),
                                               f"{name}/down")])
        inputs += [helper.make_tensor_value_info(f"past_{kind}_{layer}", TensorProto.FLOAT, [1, groups, "past", size])
                   for kind in "kv"]
        outputs += [helper.make_tensor_value_info(f"present_{kind}_{layer}", TensorProto.FLOAT,
                                                  [1, groups, "total", size]) for kind in "kv"]
    last = built.node("Slice", [x, built.constant("from", np.array([-1], np.int64)),
                                built.constant("to", np.array([1 << 30], np.int64)),
                                built.constant("axis", np.array([1], np.int64))])
    built.node("Identity", [built.linear(norm(last, "norm/gamma"), "projection")], ["logits"])
    return built.model("chat", inputs, outputs)


def build(source: Path, out: Path) -> None:
    """Write :data:`MODEL`, the tokenizer (saved by transformers), config.json and generation_config.json."""
    out.mkdir(parents=True, exist_ok=True)
    import onnx

    onnx.save(graph(*read_source(source)), str(out / MODEL))  # the float weights go once they are in the graph
    from s2s import torch_support  # transformers (and torch) only now: the weights are gone (a 0.5 GB lower peak)

    torch_support.repair_torchaudio()  # transformers imports torchaudio whenever it is installed
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(out))
    for name in ("config.json", "generation_config.json"):
        if (source / name).is_file():
            shutil.copy(source / name, out / name)


def main(argv: list[str] | None = None) -> int:
    from s2s.llm.ctranslate2_convert import source_arguments, source_folder

    parser = argparse.ArgumentParser(prog="python -m s2s.llm.onnx_build", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write")
    source_arguments(parser)
    args = parser.parse_args(argv)
    build(source_folder(args), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
