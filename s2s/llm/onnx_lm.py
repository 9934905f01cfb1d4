"""Chat models on onnxruntime with 8-bit weights (``llm=onnx``, the default), built once from the model's float weights.

Everything but the model's runtime is ``llm=ctranslate2``'s (:class:`s2s.llm.ctranslate2_lm.CTranslate2LM`: the chat
template, the static system prompt, tools, the calibration, the words' end-of-turn probability); the model is the
one :mod:`s2s.llm.onnx_build` writes, run a token at a time from the cache, greedily (or sampled at
``temperature``), with the repetition penalty on the reply's own tokens as CTranslate2 applies it.

Why: CTranslate2 runs int8 through MKL only on Intel CPUs; elsewhere its one-row products (each generated token)
go through oneDNN, slowly. On an AVX2 EPYC SmolLM2-135M made a token in 11-12 ms here against 25-26 ms there, and
its first token after a 42-token prompt in 75-110 ms against 100-150 ms (README, Answers on onnxruntime).
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from s2s.config_errors import ConfigError, ValidationContext
from s2s.llm.calibration import Capped
from s2s.llm.ctranslate2_lm import PACKAGED_NAME, CTranslate2LM, given_folder
from s2s.llm.onnx_build import MODEL, VERSION, head_size
from s2s.llm.sentence_end import sentence_end_ids
from s2s.models import (build_in_child, build_once, cache_root, fingerprint, local_path, model_source,
                        model_threads)
from s2s.onnx import cache_layout, cpu_session
from s2s.stage import require
from s2s.text import bare_words

PACKAGED_CACHE = "smollm2-135m-instruct-onnx"
WORDS_KEPT = 2  # caches after the user's words kept: the words' scoring and the reply share the turn's
TOP_K = 50  # sampling (temperature above 0) draws from this many likeliest tokens, as llm=ctranslate2 does
EXPECTED = (f"{PACKAGED_NAME} (packaged) or a local transformers folder of a Llama or Qwen2 model (config.json "
            "and *.safetensors; built once into cache_dir)")


def resolve_model(model: str, cache_dir: str | None) -> Path:
    """The built folder for ``model`` in the cache, built once by a child process."""
    if model_source(model, (PACKAGED_NAME,)) == "packaged":
        target = cache_root(cache_dir) / f"{PACKAGED_CACHE}-v{VERSION}"
        arguments = ["--packaged", *(["--cache-dir", cache_dir] if cache_dir else [])]
    else:
        folder = local_path(model)
        assert folder is not None, "validation refuses hub ids"
        target = cache_root(cache_dir) / f"onnx-{folder.name}-{fingerprint(folder)}-v{VERSION}"
        arguments = ["--source", str(folder)]
    return build_once(target, lambda out: build_in_child("s2s.llm.onnx_build", out, arguments),
                      f"{model} -> onnxruntime, 8-bit")


def model_error(model: str, context: ValidationContext) -> ConfigError | None:
    """Why ``model`` cannot be built (names the key), checked before anything loads; None when it can."""
    folder = given_folder(model, context, EXPECTED)
    if not isinstance(folder, Path):
        return folder
    if not ((folder / "config.json").is_file() and any(folder.glob("*.safetensors"))):
        return context.error("model", model, f"{EXPECTED} (it lacks config.json or *.safetensors)")
    from s2s.llm.onnx_build import FAMILIES

    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") not in FAMILIES:
        return context.error("model", model, f"{EXPECTED} (its model_type is {config.get('model_type')!r})")
    if head_size(config) % 16:  # onnxruntime's GroupQueryAttention on the CPU
        return context.error("model", model, f"{EXPECTED} whose attention heads are a multiple of 16 wide (its "
                                             f"are {head_size(config)})")
    return None


class OnnxLM(CTranslate2LM):
    """``llm=ctranslate2``'s stage on onnxruntime: the same keys, but ``device`` is the CPU and ``compute_type``
    8-bit weights (``int8``), and ``model`` a packaged name or a transformers folder."""

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        if kwargs["device"] not in ("auto", "cpu", "mps"):
            raise context.error("device", kwargs["device"], "cpu (llm=onnx runs on the CPU; on a GPU use "
                                                            "llm=ctranslate2)")
        if kwargs["compute_type"] != "int8":
            raise context.error("compute_type", kwargs["compute_type"], "int8 (llm=onnx keeps 8-bit weights)")
        super().validate_config(kwargs, context)

    @staticmethod
    def model_error(model: str, context: ValidationContext) -> ConfigError | None:
        return model_error(model, context)

    def setup(self) -> None:
        onnxruntime = require("onnxruntime", backend="llm=onnx", extra=None)
        require("onnx", backend="llm=onnx", extra=None)  # the build writes the graph with it
        require("tokenizers", backend="llm=onnx", extra=None)
        from s2s.llm.chat_template import ChatTokenizer

        self._load_tools()
        path = resolve_model(self.model_name, self.cache_dir)
        self._tokenizer = ChatTokenizer(path)
        self._end_ids = self._end_tokens(path)
        self._sentence_ends = sentence_end_ids(self._tokenizer, self._end_ids)
        self._generator = Model(cpu_session(onnxruntime, path / MODEL, model_threads(self.threads, "cpu", path,
                                                                                    MODEL)))
        self._states: dict[tuple[int, ...], tuple[dict[str, np.ndarray], int]] = {}
        self._words: OrderedDict[tuple[int, ...], tuple[np.ndarray, dict[str, np.ndarray]]] = OrderedDict()
        self._computing = threading.RLock()  # the scoring's thread and the reply's take the words' cache in turn

    def _last_log_probs(self, static: list[int], rest: list[int]) -> np.ndarray:
        """From the static part's cache (the reply's own), so that only the user's words are computed.

        onnxruntime's 8-bit products quantize all the rows of their input with one scale. Run together with the
        system part, whose first token has large activations, the user's words lost precision: the 12 real complete
        statements' end-of-turn probabilities fell to 0.04-0.41 ("Go somewhere and do something." 0.04,
        transformers' float32 0.23). From the cache they are 0.14-0.70 (0.29), as float32's 0.10-0.67."""
        logits, _ = self._after_words(static, rest)
        return _log_softmax(logits)

    def _after_words(self, static: list[int], words: list[int]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The logits and the cache after ``words`` (the chat up to the end of the user's words), run from the
        static part's cache once per turn: the words' scoring (beside the reply, in its own thread) and the reply
        share it, whichever comes first, so the user's words are computed once. Both then get the same numbers
        whatever the order (the reply goes on from it with the rest of its prompt)."""
        key = (*static, *words)
        with self._computing:
            if key not in self._words:
                cache, past = self._state(static)
                self._words[key] = self._generator.run(words, cache, past)
                while len(self._words) > WORDS_KEPT:
                    self._words.popitem(last=False)
            logits, cache = self._words[key]
        return logits.copy(), cache

    def _words_end(self, rest: list[int]) -> int:
        """Where the user's words end in a reply's prompt (``rest``, after the static part), as the words' scoring
        cuts them: before the last end-of-turn token and the closing marks before it (0: no such end)."""
        end = self._last_end(rest) or 0
        while end > 0 and not bare_words(self._tokenizer.tokenizer.decode([rest[end - 1]])):
            end -= 1
        return end

    def _state(self, static: list[int]) -> tuple[dict[str, np.ndarray], int]:
        """The cache after the static system part, computed once per part (no part: empty)."""
        if not static:
            return self._generator.empty(), 0
        key = tuple(static)
        with self._computing:
            if key not in self._states:
                _, cache = self._generator.run(static, self._generator.empty(), 0)
                self._states[key] = cache, len(static)
                self._cached.add(key)
            return self._states[key]

    def _generate(self, static: list[int], rest: list[int],
                  max_tokens: int) -> tuple[Iterator[tuple[str, float] | Capped], list[int]]:
        """As :meth:`CTranslate2LM._generate`, but generated as the reader asks: a token per ``next``."""
        decode, count, model = self._tokenizer.decoder(), [0], self._generator
        random = np.random.default_rng() if self.temperature > 0 else None

        def tokens() -> Iterator[tuple[str, float] | Capped]:
            split = self._words_end(rest)  # the user's words: their cache is the words' scoring's
            cache = self._after_words(static, rest[:split])[1] if split else self._state(static)[0]
            past, given, said = len(static) + split, rest[split:], []
            while count[0] < max_tokens:
                logits, cache = model.run(given, cache, past)
                past += len(given)
                if said and self.repetition_penalty != 1:
                    used = np.unique(said)
                    scores = logits[used]
                    logits[used] = np.where(scores < 0, scores * self.repetition_penalty,
                                            scores / self.repetition_penalty)
                log_probs = _log_softmax(logits)
                token = int(log_probs.argmax()) if random is None else _sample(logits, self.temperature, random)
                count[0] += 1
                if token in self._end_ids:
                    return
                said.append(token)
                if text := decode(token):
                    yield text, float(log_probs[token])
                given = [token]
            yield Capped()

        return tokens(), count

    def close(self) -> None:
        super().close()
        self._states, self._words = {}, OrderedDict()

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": "cpu (onnxruntime, 8-bit weights)",
                **({"tools": self.tools} if self.tools else {})}


class Model:
    """The built model's onnxruntime session (shared while the server shares weights) and its cache's shape."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.layers, self.groups, self.size = cache_layout(session)

    def empty(self) -> dict[str, np.ndarray]:
        nothing = np.zeros((1, self.groups, 0, self.size), np.float32)
        return {f"past_{kind}_{layer}": nothing for layer in range(self.layers) for kind in "kv"}

    def run(self, tokens: list[int], cache: dict[str, np.ndarray], past: int) -> tuple[np.ndarray,
                                                                                      dict[str, np.ndarray]]:
        """The logits after ``tokens`` (float32, a fresh array), given the cache of the ``past`` tokens before them,
        and the grown cache (``cache`` itself is left as it was: a static part's is reused)."""
        total = past + len(tokens)
        logits, *grown = self.session.run(None, {"tokens": np.array([tokens], np.int64),
                                                 "seqlens_k": np.array([total - 1], np.int32),
                                                 "total_length": np.array(total, np.int32), **cache})
        names = [f"past_{kind}_{layer}" for layer in range(self.layers) for kind in "kv"]
        return logits[0, -1], dict(zip(names, grown))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def _sample(logits: np.ndarray, temperature: float, random: np.random.Generator) -> int:
    """One of the ``TOP_K`` likeliest tokens, drawn from their softmax at ``temperature``."""
    top = np.argpartition(logits, -TOP_K)[-TOP_K:]
    weights = np.exp((logits[top] - logits[top].max()) / temperature)
    return int(random.choice(top, p=weights / weights.sum()))
