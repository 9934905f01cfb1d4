"""The packaged GGUF's conversion, one tensor at a time, against transformers' own GGUF loading and saving."""
from __future__ import annotations

import numpy as np
import pytest

from s2s.llm.gguf_convert import convert, unpermute, write_weights
from s2s.llm.transformers_lm import packaged_gguf


def test_unpermuting_q_and_k_matches_transformers_llama_processor():
    from s2s import torch_support

    torch_support.repair_torchaudio()  # transformers imports torchaudio whenever it is installed
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    processor = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    rng = np.random.default_rng(0)
    for name, rows, heads in (("blk.0.attn_q.weight", 576, 9), ("blk.0.attn_k.weight", 192, 3)):
        weights = rng.standard_normal((rows, 576)).astype(np.float32)
        expected = processor.process(weights=weights, name=name).weights
        np.testing.assert_array_equal(unpermute(weights, heads), expected)
        assert not np.array_equal(expected, weights)  # it moves rows: the test is not vacuous


@pytest.mark.slow
def test_the_packaged_model_converts_to_the_files_transformers_makes_of_it(tmp_path):
    """The same six files, to the byte, as loading the GGUF into a torch model and saving that (the conversion
    before, at 1.30 GB against 0.64 GB)."""
    gguf = packaged_gguf()
    convert(gguf, tmp_path / "ours")  # it readies transformers' import (torch_support.repair_torchaudio)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    theirs = tmp_path / "theirs"
    source = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = source.config
    if hasattr(config, "quantization_config"):  # some transformers versions keep the GGUF's, others do not
        del config.quantization_config
    with torch.device("meta"):  # save_pretrained refuses a GGUF-loaded model: its weights go into a fresh one
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(source.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = source.generation_config
    model.save_pretrained(theirs)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(theirs)
    del model, source
    names = sorted(path.name for path in theirs.iterdir())
    assert names == sorted(path.name for path in (tmp_path / "ours").iterdir())
    assert "model.safetensors" in names and "config.json" in names
    for name in names:
        assert (tmp_path / "ours" / name).read_bytes() == (theirs / name).read_bytes(), name


def test_a_gguf_of_another_architecture_is_refused_by_name(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "tiny-gpt2.gguf"
    writer = GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="a gpt2 GGUF; only the LLaMA architecture"):
        write_weights(path, tmp_path / "model.safetensors")
    assert not (tmp_path / "model.safetensors").exists()
