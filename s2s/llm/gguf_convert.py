"""The packaged GGUF (a LLaMA-architecture model, SmolLM2) dequantized into a float32 safetensors folder, one tensor
at a time.

transformers can load a GGUF itself, but only into a torch model: all of the float32 weights at once, then a copy
of them to save (1.30 GB at the peak for SmolLM2-135M). Here each tensor is dequantized by the ``gguf`` package,
put back into transformers' layout (the Q/K rows that llama.cpp's converter permuted for its rotary layout, undone
as transformers' ``LlamaTensorProcessor`` does), written, and dropped: the peak is one tensor on top of numpy. The
config, the generation config and the tokenizer come from transformers' own reading of the GGUF's metadata, after
the weights, so the folder is the one ``from_pretrained(gguf_file=...)`` then ``save_pretrained`` made, to the byte
(``tests/test_gguf_convert.py``).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from s2s import torch_support

# the parameters of a LLaMA-architecture causal LM, by transformers' names; gguf's own name map gives each one's
# GGUF name (``lm_head`` is absent when the embeddings are tied)
GLOBAL = ("model.embed_tokens", "model.norm", "lm_head")
LAYER = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
ALIGN = 8  # safetensors pads its JSON header with spaces to this


def hf_names(gguf_names: list[str], layers: int) -> dict[str, str]:
    """GGUF tensor name -> transformers' name, for the tensors of a LLaMA-architecture GGUF."""
    from gguf import MODEL_ARCH, get_tensor_name_map

    mapping = get_tensor_name_map(MODEL_ARCH.LLAMA, layers)
    names = [*GLOBAL, *(f"model.layers.{index}.{part}" for index in range(layers) for part in LAYER)]
    wanted = {mapping.get_name(name): name for name in names}
    found = {}
    for gguf_name in gguf_names:
        base, _, suffix = gguf_name.rpartition(".")
        if base not in wanted:
            raise ValueError(f"{gguf_name}: not a tensor of a LLaMA-architecture GGUF")
        found[gguf_name] = f"{wanted[base]}.{suffix}"
    return found


def header(shapes: dict[str, tuple[int, ...]]) -> tuple[bytes, list[str]]:
    """safetensors' header for float32 ``shapes`` (tensors in name order, as the safetensors library lays them
    out), and that order."""
    order = sorted(shapes)
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}  # "pt": transformers reads the file as torch's
    offset = 0
    for name in order:
        size = 4 * int(np.prod(shapes[name], dtype=np.int64))
        entries[name] = {"dtype": "F32", "shape": list(shapes[name]), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % ALIGN), order


def unpermute(weights: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's converter's permutation of a Q or K weight's rows (``heads``: the query heads for Q, the
    key-value heads for K): transformers' ``LlamaTensorProcessor`` does the same."""
    rows = weights.reshape(heads, weights.shape[0] // heads // 2, 2, *weights.shape[1:])
    return rows.swapaxes(2, 1).reshape(weights.shape)


def write_weights(gguf: Path, target: Path) -> None:
    """``target`` (safetensors, float32, transformers' names and layout) from ``gguf``'s tensors, one at a time."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(gguf)
    architecture = reader.fields["general.architecture"].contents()
    if architecture != "llama":
        raise ValueError(f"{gguf.name}: a {architecture} GGUF; only the LLaMA architecture converts here")
    heads = {"attn_q": reader.fields["llama.attention.head_count"].contents(),
             "attn_k": reader.fields["llama.attention.head_count_kv"].contents()}
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    names = hf_names(list(tensors), reader.fields["llama.block_count"].contents())
    shapes = {names[name]: tuple(int(n) for n in reversed(tensor.shape)) for name, tensor in tensors.items()}
    text, order = header(shapes)
    by_hf = {hf: name for name, hf in names.items()}
    with open(target, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text)
        for hf in order:
            tensor = tensors[by_hf[hf]]
            weights = dequantize(tensor.data, tensor.tensor_type)
            kind = tensor.name.split(".")[-2]
            weights = np.ascontiguousarray(unpermute(weights, heads[kind]) if kind in heads else weights, "<f4")
            if weights.shape != shapes[hf]:
                raise ValueError(f"{tensor.name}: dequantized to {weights.shape}, the header says {shapes[hf]}")
            weights.tofile(file)


def convert(gguf: Path, out: Path) -> None:
    """Write ``out`` (config, generation config, tokenizer, ``model.safetensors`` in float32) from ``gguf``.

    The weights go first, with numpy alone; transformers (which imports torch) reads the metadata after, so the two
    peaks do not add up: 0.64 GB for SmolLM2-135M.
    """
    out.mkdir(parents=True, exist_ok=True)
    write_weights(gguf, out / "model.safetensors")
    torch_support.repair_torchaudio()  # transformers imports torchaudio whenever it is installed
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):  # dequantized now: a stale gguf entry only warns at each load
        del config.quantization_config
    config.dtype = "float32"  # the dtype a CPU computes in: loading maps the file instead of converting a copy
    config.architectures = ["LlamaForCausalLM"]  # what the model class's save_pretrained writes
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
