"""Chat models through CTranslate2 (int8 on CPU), streamed token by token, with no torch or transformers at run time.

The packaged SmolLM2-135M-Instruct (and any local transformers folder) is converted once into the cache by a
child process (``s2s.llm.ctranslate2_convert``); the stage itself needs only ``ctranslate2``, ``tokenizers`` and
jinja2 (the chat template, rendered as transformers renders it: ``s2s.llm.chat_template``).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from s2s.config_errors import ConfigError, ValidationContext
from s2s.llm.base import FIRST_CHUNK_MIN_WORDS, FIRST_CHUNK_WORDS, LLMStage
from s2s.llm.chat_template import thinking_error
from s2s.llm.calibration import CalibratedReplies, Capped, Confidence, Measure, calibrated
from s2s.llm.keywords import (CompactHistory, FirstChunkMinWords, FirstChunkWords, HistoryTokens, HistoryTurns,
                              MaxNewTokens, RepetitionPenalty, ReplyLanguage, Temperature, Thinking, Threshold)
from s2s.llm.sentence_end import sentence_end_ids
from s2s.llm.tools import TemplateTools, ToolCall, ToolCallFilter, check_module
from s2s.messages import TurnVerdict
from s2s.models import (build_in_child, build_once, cache_root, fingerprint, local_path, model_source,
                        model_threads)
from s2s import sharing
from s2s.sharing import shared_model
from s2s.stage import require
from s2s.usage import Usage
from s2s.text import bare_words

log = logging.getLogger(__name__)
PACKAGED_NAME = "SmolLM2-135M-Instruct"
PACKAGED_CACHE = "smollm2-135m-instruct-ct2"  # + -<weights>, e.g. smollm2-135m-instruct-ct2-int8
STREAM_AHEAD = 2  # tokens generation may run ahead of the reader
# distinct system prompts given as static prompts: CTranslate2 keeps each one's state for the life of the model,
# so a server whose sessions each send their own instructions would grow without end; later ones get none
MAX_STATIC_PROMPTS = 8
ComputeType = Literal["int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16", "bfloat16", "float32"]
EXPECTED = (f"{PACKAGED_NAME} (packaged), a local CTranslate2 folder (model.bin, tokenizer.json and a chat "
            "template) or a local transformers folder (config.json and weights; converted once into cache_dir)")


def stored_weights(compute_type: str) -> str:
    """The quantization a conversion stores for ``compute_type`` (int8 variants share int8 weights)."""
    return "int8" if compute_type.startswith("int8") else compute_type


def resolve_model(model: str, cache_dir: str | None, compute_type: str) -> Path:
    """A CTranslate2 folder for ``model``: as given, or converted once into the cache."""
    weights = stored_weights(compute_type)
    if model_source(model, (PACKAGED_NAME,)) == "packaged":
        target = cache_root(cache_dir) / f"{PACKAGED_CACHE}-{weights}"
        arguments = [weights, "--packaged", *(["--cache-dir", cache_dir] if cache_dir else [])]
    else:
        folder = local_path(model)
        assert folder is not None, "validation refuses hub ids"
        if (folder / "model.bin").is_file():
            return folder
        target = cache_root(cache_dir) / f"ct2-{folder.name}-{fingerprint(folder)}-{weights}"
        arguments = [weights, "--source", str(folder)]
    return build_once(target, lambda out: build_in_child("s2s.llm.ctranslate2_convert", out, arguments),
                      f"{model} -> CTranslate2 {weights}")


def given_folder(model: str, context: ValidationContext, expected: str) -> Path | ConfigError | None:
    """The existing folder ``model`` names; None for the packaged name; else the error saying ``expected``."""
    folder = local_path(model)
    if folder is None:
        return None if model == PACKAGED_NAME else context.error("model", model, expected)
    return folder if folder.is_dir() else context.error("model", model, f"{expected} (no such folder)")


def model_error(model: str, context: ValidationContext) -> ConfigError | None:
    """Why ``model`` cannot load (names the key), checked before anything loads; None when it can."""
    from s2s.llm.chat_template import chat_template_text

    folder = given_folder(model, context, EXPECTED)
    if not isinstance(folder, Path):
        return folder
    if (folder / "model.bin").is_file():
        missing = [name for name in ("model.bin", "tokenizer.json") if not os.access(folder / name, os.R_OK)]
        try:
            template = chat_template_text(folder)
        except (OSError, ValueError):
            template = None
        missing += [] if template else ["a chat template (chat_template.jinja or tokenizer_config.json)"]
        if missing:
            return context.error("model", model, f"{EXPECTED} (the CTranslate2 folder lacks {', '.join(missing)} "
                                                 "or cannot read it)")
        return None
    weights = any(folder.glob("*.safetensors")) or (folder / "pytorch_model.bin").is_file()
    if not ((folder / "config.json").is_file() and weights):
        return context.error("model", model, f"{EXPECTED} (it has neither model.bin nor config.json with weights)")
    return None


class CTranslate2LM(CalibratedReplies, TemplateTools, LLMStage):
    """A chat model run by ``ctranslate2.Generator.generate_tokens``; the reply is pulled token by token.

    Args:
        model: ``SmolLM2-135M-Instruct`` (packaged, offline), a local CTranslate2 folder or a local transformers
            folder (converted once into ``cache_dir``).
        device: auto, cpu, cuda or cuda:N (mps runs on the CPU: CTranslate2 has no Metal backend).
        compute_type: CTranslate2's precision; int8 is the fastest on a CPU.
        system_prompt: the assistant's instructions.
        max_new_tokens: reply length cap.
        history_turns: how many previous exchanges the model sees.
        history_tokens: the previous exchanges the model sees stop at this many tokens (oldest dropped
            first, the system prompt never); null: only ``history_turns`` limits them.
        compact_history: exchanges past that budget are summarised by the model, after a reply, into a note
            at the end of the system prompt, instead of being dropped (:mod:`s2s.compaction`).
        thinking: ``enable_thinking`` for the chat template of a thinking model (Qwen3); null: the model's own
            default. Reasoning is never spoken.
        temperature: 0 decodes greedily (reproducible); above 0 samples (top 50, as transformers).
        repetition_penalty: above 1 makes tokens the reply already used less likely (1 turns it off); as with
            llm=transformers the prompt is not penalised (``generate_tokens`` penalises generated tokens only).
        static_prompt: the system prompt's model state is computed once and reused by every turn (CTranslate2's
            ``static_prompt``). float32 replies are the same as without it; int8 rounds the state computed apart
            a little differently, so a reply may take another word at a near tie (3 of 20 on the answer set).
        first_chunk_words: the first TTS chunk ends at a clause or after this many words (0: a whole sentence).
        first_chunk_min_words: a clause shorter than this does not end the first chunk.
        language: the language replies are in (the system prompt's), as a Whisper code; null: unknown.
        follow_user_language: when a turn's transcript is in another language (the STT detected it), the
            system prompt asks for the reply in that language.
        cache_dir: where conversions are kept.
        tools: an importable module with ``TOOLS`` and ``call_tool`` (trusted code), or null. Chat templates
            with a tools section get them natively; others get them in the system prompt (``<tool_call>``).
        unsure_below: when the model's confidence in the reply's first tokens (``unsure_measure`` of their
            probabilities, :mod:`s2s.llm.calibration`) is below this, the reply starts "I'm not sure, but I
            think"; null: never.
        dont_know_below: below this the reply is "I don't know that one." instead; null: never.
        unsure_measure: ``mean`` or ``min`` token probability over the first sentence (4 content tokens at most).
    """

    def __init__(self, model: str = PACKAGED_NAME, device: str = "auto", compute_type: ComputeType = "int8",
                 system_prompt: str | None = None, max_new_tokens: MaxNewTokens = 64,
                 history_turns: HistoryTurns = 4,
                 history_tokens: HistoryTokens = None,
                 temperature: Temperature = 0.0,
                 repetition_penalty: RepetitionPenalty = 1.15, static_prompt: bool = True,
                 first_chunk_words: FirstChunkWords = FIRST_CHUNK_WORDS,
                 first_chunk_min_words: FirstChunkMinWords = FIRST_CHUNK_MIN_WORDS,
                 language: ReplyLanguage = "en",
                 follow_user_language: bool = True, cache_dir: str | None = None,
                 tools: str | None = None, unsure_below: Threshold = None,
                 dont_know_below: Threshold = None,
                 unsure_measure: Measure = "mean", compact_history: CompactHistory = False,
                 thinking: Thinking = None) -> None:
        self.model_name = model
        self.device = "cpu" if device in ("auto", "mps") else device  # validation has resolved auto already
        self.compute_type = compute_type
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.repetition_penalty = repetition_penalty
        self.static_prompt = static_prompt
        self.cache_dir = cache_dir
        self.unsure_below, self.dont_know_below, self.unsure_measure = unsure_below, dont_know_below, unsure_measure
        self._init_chat(system_prompt, history_turns, tools, first_chunk_words, first_chunk_min_words,
                        history_tokens, language, follow_user_language, compact_history, thinking)
        self._generator: Any = None
        self._tokenizer: Any = None
        self._end_ids: list[int] = []
        self._sentence_ends: list[int] = []
        self._static: dict[str, list[int]] = {}  # rendered system part -> its token ids
        self._cached: set[tuple[int, ...]] = set()  # static parts whose state CTranslate2 keeps (cached input)

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        check_module(kwargs["tools"], f"{context.group}.tools")
        if error := cls.model_error(kwargs["model"], context) or \
                thinking_error(kwargs["thinking"], kwargs["model"], context, (PACKAGED_NAME,)):
            raise error

    @staticmethod
    def model_error(model: str, context: ValidationContext) -> ConfigError | None:
        """Why ``model`` cannot load, or None (:func:`model_error`)."""
        return model_error(model, context)

    def count_tokens(self, text: str) -> int:
        if self._tokenizer is None:  # before setup: the estimate
            return super().count_tokens(text)
        return len(self._tokenizer.encode(text))

    def setup(self) -> None:
        ctranslate2 = require("ctranslate2", backend="llm=ctranslate2", extra=None)
        require("tokenizers", backend="llm=ctranslate2", extra=None)
        from s2s.llm.chat_template import ChatTokenizer

        self._load_tools()
        path = resolve_model(self.model_name, self.cache_dir, self.compute_type)
        self._tokenizer = ChatTokenizer(path)
        self._end_ids = self._end_tokens(path)
        self._sentence_ends = sentence_end_ids(self._tokenizer, self._end_ids)
        device, _, index = self.device.partition(":")
        threads = model_threads(self.threads, device, path)
        # a paced reply holds its worker: one per pipeline that may call at once, and a second for one pipeline,
        # so the words' scoring runs beside the reply's first tokens (s2s.llm.base._verdict_first)
        workers = max(2, sharing.users())
        self._generator = shared_model(  # one copy per process when the realtime server shares weights
            ("ctranslate2", str(path), device, int(index or 0), self.compute_type, threads, workers),
            lambda: ctranslate2.Generator(str(path), device=device, device_index=int(index or 0),
                                          compute_type=self.compute_type, intra_threads=threads,
                                          inter_threads=workers))

    def _end_tokens(self, path: Path) -> list[int]:
        """generation_config's eos ids, the tokenizer's eos and CTranslate2's (SmolLM2's GGUF names <|im_start|>)."""
        ids: list[Any] = []
        if (path / "generation_config.json").is_file():
            eos = json.loads((path / "generation_config.json").read_text()).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [eos]
        tokens = [self._tokenizer.special_tokens.get("eos_token")]
        if (path / "config.json").is_file():
            tokens.append(json.loads((path / "config.json").read_text()).get("eos_token"))
        ids += [self._tokenizer.token_id(token) for token in tokens if token]
        return sorted({index for index in ids if isinstance(index, int)})

    def warm_up(self) -> None:  # with the configured system prompt: its state is then cached for the first turn
        if TurnVerdict in self.wanted:  # turn=words: the first scoring call pays one-off costs too
            self.end_of_turn_probability(self.chat_messages("Hi"))
        pieces = self.stream(self.chat_messages("Hi"))
        try:
            next(pieces, None)
        finally:
            pieces.close()

    def prompt(self, messages: list[dict[str, Any]], tools: bool = True) -> tuple[list[int], list[int]]:
        """The rendered chat as token ids: (the static system part, or [] without one; the rest).

        A system prompt that carries the history's summary has no static part: CTranslate2 keeps every static
        prompt's state for the life of the model, and a summary changes every few turns.
        """
        offered = self._template_tools().get("tools") if tools else None
        return self._split(messages, self._tokenizer.encode(self._tokenizer.render(messages, tools=offered,
                                                                                   **self.template_switches())),
                           offered)

    def _split(self, messages: list[dict[str, Any]], ids: list[int], offered: Any) -> tuple[list[int], list[int]]:
        """``ids`` (``messages`` rendered with the ``offered`` tools) as (the static system part, or []; the rest)."""
        switches = self.template_switches()
        if not (self.static_prompt and messages and messages[0]["role"] == "system") or \
                (self.context.summary and self.context.summary in str(messages[0]["content"])):
            return [], ids
        system = self._tokenizer.render(messages[:1], add_generation_prompt=False, tools=offered, **switches)
        if system not in self._static:
            if len(self._static) >= MAX_STATIC_PROMPTS:
                return [], ids
            self._static[system] = self._tokenizer.encode(system)
        static = self._static[system]
        # the system part must tokenize as the start of the whole prompt (true of ChatML); else no static part
        if 0 < len(static) < len(ids) and ids[:len(static)] == static:
            return static, ids[len(static):]
        return [], ids

    def end_of_turn_probability(self, messages: list[dict[str, Any]]) -> float | None:
        """P(the user's words end here): the model's probability, right after the words, of a sentence end ("." "?"
        "!" or a token starting with one) or of the end-of-turn token; one ``forward_batch`` call.

        Whisper's closing marks are taken off first ("...", "-", "?", ".", ","): they follow the audio, not the
        words (it closes half-questions with "?" and trailing speech with "..."), and the model then says itself
        whether the words could stop there. Measured on the turn bench's real recordings (python -m s2s.bench
        turns): finished statements 0.14-0.66 ("He turned sharply and faced Gregson across the table" 0.59), the
        first halves of paused ones mostly under 0.05 ("He began a confused complaint against" 0.001); the
        end-of-turn token alone after the words as heard gave the finished ones 0.01-0.26, under the halves.
        """
        text = bare_words(str(messages[-1]["content"] or ""))
        if not text:
            return None
        chat = [*messages[:-1], {**messages[-1], "content": text}]
        ids = self._tokenizer.encode(self._tokenizer.render(chat, add_generation_prompt=False,
                                                            **self.template_switches()))
        end = self._last_end(ids)
        if end is None:  # a template with no end-of-turn token after the user's words cannot be scored
            return None
        import numpy as np

        static, rest = self._split(chat, ids[:end], None)
        return float(np.exp(self._last_log_probs(static, rest)[self._sentence_ends]).sum())

    def _last_end(self, ids: list[int]) -> int | None:
        """Where the last end-of-turn token is in ``ids`` (the one that closes the user's words), None without one."""
        return next((index for index in range(len(ids) - 1, -1, -1) if ids[index] in self._end_ids), None)

    def _last_log_probs(self, static: list[int], rest: list[int]) -> Any:
        """The model's log-probabilities of the token after ``static`` (the system part, or []) and ``rest`` (a
        numpy vector): one ``forward_batch`` over both (CTranslate2 keeps no state of a static part for it)."""
        import numpy as np

        log_probs = self._generator.forward_batch([self._tokenizer.tokens(static + rest)], return_log_probs=True)
        return np.asarray(log_probs)[0, -1]

    def stream(self, messages: list[dict[str, Any]]) -> Iterator[str | ToolCall | Confidence | Capped | Usage]:
        static, rest = self.prompt(self._with_tools(messages))
        cached = len(static) if static and tuple(static) in self._cached else 0
        tokens, count = self._generate(static, rest, self.reply_tokens(self.max_new_tokens))
        calls = ToolCallFilter() if self._toolbox else None  # takes <tool_call> out of the spoken text
        yield from calibrated(tokens, self.calibrator(messages), calls)
        yield Usage(len(static) + len(rest), count[0], cached)

    def complete(self, messages: list[dict[str, Any]], max_tokens: int) -> Iterator[str | Usage]:
        static, rest = self.prompt(messages, tools=False)
        cached = len(static) if static and tuple(static) in self._cached else 0
        tokens, count = self._generate(static, rest, max_tokens)
        try:
            for token in tokens:
                if not isinstance(token, Capped):
                    yield token[0]
        finally:
            tokens.close()
        yield Usage(len(static) + len(rest), count[0], cached)

    def _generate(self, static: list[int], rest: list[int],
                  max_tokens: int) -> tuple[Iterator[tuple[str, float] | Capped], list[int]]:
        """The generated tokens' text and log-probability, ``Capped()`` at the cap; and the count of tokens
        generated so far (the end token included), which grows as they are read.

        Closing the iterator stops generation at the next step.
        """
        # pulled, not pushed: generate_tokens' own queue is unbounded, so the callback holds generation while the
        # reader is STREAM_AHEAD tokens behind (the runner's first-audio pause leaves the CPU to the TTS)
        room, cancelled = threading.Semaphore(STREAM_AHEAD), threading.Event()

        def pace(step: Any) -> bool:
            while not room.acquire(timeout=0.1):
                if cancelled.is_set():
                    break
            return cancelled.is_set()  # True stops generation

        sampling = {"sampling_topk": 50, "sampling_temperature": self.temperature} if self.temperature > 0 else \
            {"sampling_topk": 1}
        steps = self._generator.generate_tokens(
            self._tokenizer.tokens(rest), max_length=max_tokens, end_token=self._end_ids,
            repetition_penalty=self.repetition_penalty, static_prompt=self._tokenizer.tokens(static) or None,
            callback=pace, return_log_prob=True, **sampling)
        if static:  # CTranslate2 keeps its state from now on
            self._cached.add(tuple(static))
        decode = self._tokenizer.decoder()
        count = [0]

        def tokens() -> Iterator[tuple[str, float] | Capped]:
            try:
                for step in steps:
                    room.release()
                    count[0] += 1
                    if step.token_id in self._end_ids:
                        return
                    if text := decode(step.token_id):
                        yield text, step.log_prob
            finally:  # also when the reader closes this generator: the next step's callback stops generation
                cancelled.set()
                room.release()
                steps.close()
            if count[0] >= max_tokens:
                yield Capped()

        return tokens(), count

    def close(self) -> None:
        super().close()  # a summary being written stops first
        self._generator = self._tokenizer = None
        self._static.clear()
        self._cached.clear()

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": self.device, "compute_type": self.compute_type,
                **({"tools": self.tools} if self.tools else {})}
