"""Shared behaviour of LLM stages: chat history, sentence streaming, tool calls, timing, token usage, summaries."""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from s2s.aside import Aside
from s2s.chat_context import KEEP, ChatContext, TurnPlan
from s2s.compaction import SUMMARY_MAX_TOKENS, with_summary
from s2s.languages import language_name
from s2s.llm.calibration import Capped, Confidence
from s2s.llm.tools import ToolCall, Toolbox, ToolResult
from s2s.messages import Data, Message, Metric, ReplyText, SpeechSegment, Transcript, TurnEnd, TurnVerdict
from s2s.stage import Stage
from s2s.text import SentenceSplitter, TagFilter, clean_for_speech
from s2s.usage import Usage, metrics

log = logging.getLogger(__name__)
# the reply's first TTS chunk ends at a clause or after this many words: measured on 2 cores, 4 words got the
# first audio out 0.25 s sooner than 6 (python -m s2s.bench latency --versus llm.first_chunk_words=4)
FIRST_CHUNK_WORDS = 4
FIRST_CHUNK_MIN_WORDS = 3  # ... but a clause shorter than this does not end it ("Yes," alone sounds clipped)
# conf/llm/_chat_base.yaml states both for every option; a test keeps it equal to these
MAX_TOOL_ROUNDS = 3  # model -> tools -> model ... at most this many times per turn, then the reply must be text
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # a thinking model's reasoning (Qwen3, DeepSeek-R1): never spoken
# what the history keeps of a turn the model heard as audio (stt=none): the audio goes with its own turn only, so
# a request never grows by every earlier utterance; the model's reply, kept after it, says what was asked
SPOKEN_TURN = "[an earlier spoken turn; its audio is not kept]"


class ReplyFailed(RuntimeError):
    """The backend failed mid-reply (a server dropped the stream, timed out, answered an error).

    The turn ends with what was already spoken and the error is logged and recorded; the conversation goes on.
    """


class LLMStage(Stage):
    """Base of LLM stages: subclasses implement ``stream(messages)`` yielding text pieces (and ``ToolCall``s).

    ``process`` keeps the last ``history_turns`` exchanges (fewer when they pass ``history_tokens``), tells the
    model to answer in the user's language when a transcript carries one other than ``language`` (the STT
    detected it; ``follow_user_language``), releases
    the reply sentence by sentence as it streams (so TTS starts before the LLM ends), reports the time to first
    token and ends the turn. Reasoning in ``<think>...</think>`` is neither spoken nor kept. With
    ``llm.tools``, the calls a reply asks for run after its stream ends, their results go back to the model
    (``tool_messages``) and its follow-up is spoken; each call is reported as a ``tool_call`` metric that
    the recorder writes into the turn's line of transcript.jsonl. Each round's token ``Usage`` (which ``stream``
    yields last) leaves as metrics (:func:`s2s.usage.metrics`) and counts in the context. With
    ``compact_history`` the context summarises what passes the history budget after each reply
    (:mod:`s2s.compaction`); the stage writes the summary (``summarise``) and the next turn stops it.
    """

    accepts: tuple[type[Data], ...] = (Transcript,)  # a backend that hears audio adds SpeechSegment (stt=none)
    emits = (ReplyText,)
    system_prompt: str | None
    history_turns: int
    history_tokens: int | None

    def _init_chat(self, system_prompt: str | None, history_turns: int, tools: str | None = None,
                   first_chunk_words: int = FIRST_CHUNK_WORDS,
                   first_chunk_min_words: int = FIRST_CHUNK_MIN_WORDS, history_tokens: int | None = None,
                   language: str | None = "en", follow_user_language: bool = True, compact_history: bool = False,
                   thinking: bool | None = None) -> None:
        self.system_prompt = system_prompt  # the configured instructions, unless the context or turn has its own
        self.language = language  # what replies are in unless the user speaks another language (None: unknown)
        self.follow_user_language = follow_user_language
        self.history_turns = history_turns
        self.history_tokens = history_tokens  # the previous exchanges' token budget; None: only the turn count
        self.tools = tools
        self.compact_history = compact_history  # exchanges past the budget are summarised, not dropped
        self.thinking = thinking  # a thinking model's enable_thinking switch (None: the model's own default)
        self.first_chunk_words = first_chunk_words  # the reply's first TTS chunk: a clause or this many words
        self.first_chunk_min_words = first_chunk_min_words  # ... but never fewer ("Yes," alone sounds clipped)
        self._own_tools: Toolbox | None = None  # llm.tools, loaded in setup
        self._toolbox: Toolbox | None = None  # the tools of the turn being answered (backends offer these)
        self._turn_tokens: int | None = None  # the token cap of the turn being answered, when it has its own
        self.context = ChatContext()  # the conversation it is lent: a local run's own until one is lent

    def _load_tools(self) -> None:
        """Import the ``llm.tools`` module (trusted user code); called from ``setup``."""
        self._own_tools = self._toolbox = Toolbox(self.tools) if self.tools else None

    def tool_messages(self, calls: list[ToolCall], results: list[ToolResult]) -> list[dict[str, Any]]:
        """The assistant's calls and their results as chat messages (OpenAI chat-completions form)."""
        return [{"role": "assistant", "content": "",
                 "tool_calls": [{"id": call.id, "type": "function",
                                 "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
                                for call in calls]},
                *({"role": "tool", "tool_call_id": result.call.id, "content": result.output} for result in results)]

    def reset(self) -> None:
        """A new conversation (the local run's reset; a pool's pipeline forgets the session it was lent to)."""
        self.context.cancel_compaction(wait_s=1.0)  # the model is the next conversation's
        self.context = ChatContext()

    def close(self) -> None:
        """Stop a summary being written (backends free their model after this)."""
        self.context.cancel_compaction(wait_s=1.0)

    def template_switches(self) -> dict[str, Any]:
        """What a local backend passes its chat template besides the messages: ``enable_thinking`` when set."""
        return {} if self.thinking is None else {"enable_thinking": self.thinking}

    def complete(self, messages: list[dict[str, Any]], max_tokens: int) -> Iterator[str | Usage]:
        """A plain completion of ``messages``: its text pieces, then its ``Usage``; no tools, no calibration.

        Closing the generator stops generation (as closing ``stream`` does). Backends that can summarise the
        history implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot write a summary of the history")

    def summarise(self, messages: list[dict[str, Any]], stop: threading.Event) -> tuple[str | None, Usage | None]:
        """The summary the ``messages`` ask for (s2s/compaction.py), given up when ``stop`` is set; its cost."""
        pieces, text, usage = self.complete(messages, SUMMARY_MAX_TOKENS), [], None
        try:
            for piece in pieces:
                if stop.is_set():
                    return None, usage
                if isinstance(piece, Usage):
                    usage = piece
                else:
                    text.append(piece)
        finally:
            pieces.close()  # type: ignore[attr-defined]
        thoughts = TagFilter(THINK_OPEN, THINK_CLOSE)
        return "".join([*thoughts.feed("".join(text)), *thoughts.finish()]).strip() or None, usage

    def discard(self, turn: int) -> None:
        """Forget ``turn``: a speculative attempt the user spoke over leaves nothing in the history."""
        self.context.discard(turn)

    def toolbox(self, planned: Any = KEEP) -> Toolbox | None:
        """The tools of a turn: its plan's, else the context's (a realtime session's), else ``llm.tools``."""
        for choice in (planned, self.context.tools):
            if choice is not KEEP:
                return choice
        return self._own_tools

    def stream(self, messages: list[dict[str, Any]]) -> Iterator[str | ToolCall]:
        raise NotImplementedError

    def reply_tokens(self, configured: int) -> int:
        """The cap a backend's ``stream`` puts on the reply: its ``configured`` one, or the turn's own when lower
        (a realtime client's ``max_output_tokens``)."""
        return configured if self._turn_tokens is None else min(configured, self._turn_tokens)

    def end_of_turn_probability(self, messages: list[dict[str, Any]]) -> float | None:
        """The model's probability that the user's turn ends after the last message's words (``turn=words``).

        The stage yields it as a :class:`TurnVerdict` before a speculative reply; None (backends that cannot
        score a prompt) yields none, and the VAD then waits for its ``max_silence_ms``.
        """
        return None

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` takes in the prompt: about 4 characters a token, unless the backend has a tokenizer."""
        return -(-len(text) // 4)

    def chat_messages(self, user_text: str | list[dict[str, Any]], instructions: Any = KEEP,
                      user_language: str | None = None) -> list[dict[str, Any]]:
        """The prompt: the context's system prompt (always; ``instructions`` replaces it for one turn), the
        exchanges its window keeps, then ``user_text`` (the words, or a backend's content parts for audio).
        ``user_language`` is the transcript's language code: when it is another than ``language``, the system
        prompt ends by asking for a reply in it."""
        context = self.context
        window = context.window(self.history_turns, self.history_tokens, self.count_tokens)
        prompt = next(choice for choice in (instructions, context.system_prompt, self.system_prompt)
                      if choice is not KEEP)
        prompt = with_summary(prompt, context.summary)
        if note := self.language_note(user_language):
            prompt = f"{prompt}\n{note}" if prompt else note
        system = [{"role": "system", "content": prompt}] if prompt else []
        return [*system, *window, {"role": "user", "content": user_text}]

    def language_note(self, user_language: str | None) -> str | None:
        """What the system prompt adds for a user speaking ``user_language`` (None: nothing to add)."""
        name = language_name(user_language)
        if not self.follow_user_language or name is None or name == language_name(self.language):
            return None
        return f"The user is speaking {name}: always answer in {name}."

    def user_content(self, message: Transcript | SpeechSegment) -> str | list[dict[str, Any]]:
        """What the model reads of the user's turn: the transcript's words. A backend that hears audio (it
        ``accepts`` SpeechSegment) returns the segment as its API's content parts."""
        if isinstance(message, Transcript):
            return message.text
        raise TypeError(f"{type(self).__name__} takes text only, not {type(message).__name__}")

    def process(self, message: Data) -> Iterator[Message]:
        """Reply to one transcript (or, for a backend that hears audio, one utterance), sentence by sentence, then
        end the turn; the history keeps what was said (:data:`SPOKEN_TURN` for an utterance)."""
        assert isinstance(message, (Transcript, SpeechSegment))
        start = time.perf_counter()
        # a sentence the reply already said ends it (small models loop): every backend stops the same way
        splitter = SentenceSplitter(first_chunk_words=self.first_chunk_words,
                                    first_chunk_min_words=self.first_chunk_min_words, stop_on_repeat=True)
        finished = False
        said: list[str] = []  # sentences the runner took: an interrupted reply keeps what was said
        context = self.context  # the conversation this turn belongs to, even if another is lent meanwhile
        context.cancel_compaction()  # a summary being written gives way to this reply
        if isinstance(message, Transcript) and message.resumes is not None:  # its words hold that turn's too
            context.discard(message.resumes)
        plan = context.take_plan(message.turn)
        messages = self.chat_messages(self.user_content(message), plan.instructions, message.language)
        # the VAD asks: do these words end the turn? (an utterance heard as audio has no words to judge)
        scoring = None
        if isinstance(message, Transcript) and message.speculative and TurnVerdict in self.wanted:
            scoring = Aside(self.end_of_turn_probability, list(messages), name="s2s-llm-aside")
        try:
            self._toolbox = self.toolbox(plan.toolbox)
            self._turn_tokens = plan.max_tokens
            yield from _verdict_first(self._reply(message, messages, splitter, said, start, context, plan), scoring,
                                      message.turn)
            finished = True
        finally:  # also when the runner closes the generator (barge-in, cancel, stop)
            self._turn_tokens = None
            if plan.remember:
                context.remember(message.turn, message.text if isinstance(message, Transcript) else SPOKEN_TURN,
                                 splitter.text.strip() if finished else " ".join(said))
                if self.compact_history:  # in its own thread: the reply is over
                    context.compact(self.history_turns, self.history_tokens, self.count_tokens, self.summarise)
        yield TurnEnd(message.turn)

    def _reply(self, message: Transcript | SpeechSegment, messages: list[dict[str, Any]], splitter: SentenceSplitter,
               said: list[str], start: float, context: ChatContext, plan: TurnPlan = TurnPlan()) -> Iterator[Message]:
        """Stream one reply, running the tools it calls, and yield its sentences as they end.

        Each round streams ``messages`` through ``stream``: text pieces go through ``splitter`` and leave as
        ``ReplyText`` (the first non-blank piece also yields the ``llm_first_token_s`` metric), ``ToolCall``s are
        kept, reasoning (``<think>``) is dropped, and the round's ``Usage`` is counted and yielded as metrics. A
        round that asked for tools runs them, appends the calls and results to ``messages`` and streams again, at
        most ``MAX_TOOL_ROUNDS`` times. A repeated sentence or a ``ReplyFailed`` ends the reply; after a
        failure the unfinished sentence is dropped (and an ``llm_error`` metric says why), otherwise the
        splitter's tail is spoken.

        Args:
            message: the user's transcript or utterance (its turn and language label every output).
            messages: the chat so far, ending with the user's text.
            splitter: cuts the reply into TTS chunks; it keeps the whole reply's text for the history.
            said: filled with each chunk as it is yielded, so an interrupted reply remembers what was said.
            start: ``perf_counter`` when the turn began, for the first-token metric.
            context: the turn's conversation (it counts the tokens; it says whether tool calls may be logged).
            plan: the turn's plan: whether the reply is said aloud (False: text only, the TTS passes it by), and
                in which voice.
        """
        first, failed, capped = True, False, False
        thoughts = TagFilter(THINK_OPEN, THINK_CLOSE)  # over the whole reply: a round may end inside one

        def speak(piece: str) -> Iterator[Message]:  # text that is no reasoning
            nonlocal first
            if first and piece.strip():
                first = False
                yield Metric(message.turn, "llm_first_token_s", time.perf_counter() - start)
            for sentence in splitter.feed(piece):
                if text := clean_for_speech(sentence):
                    yield ReplyText(text, message.turn, message.language, plan.spoken, plan.voice)
                    said.append(text)

        for round_ in range(MAX_TOOL_ROUNDS + 1):
            calls: list[ToolCall] = []
            pieces = self.stream(messages)
            try:
                for piece in pieces:
                    if isinstance(piece, ToolCall):
                        calls.append(piece)
                        continue
                    if isinstance(piece, Usage):
                        context.count(piece)
                        yield from metrics(message.turn, piece)
                        continue
                    if isinstance(piece, Confidence):  # a calibrated backend measured its first tokens (an event
                        # of the turn, as a tool call is: its value is when, the probabilities are its details)
                        yield Metric(message.turn, "llm_confidence", piece.seconds,
                                     {"event": "llm_confidence", "mean": piece.mean, "min": piece.min,
                                      "tokens": piece.tokens, "verdict": piece.verdict})
                        continue
                    if isinstance(piece, Capped):
                        capped = True
                        continue
                    for text in thoughts.feed(piece):
                        yield from speak(text)
                    if splitter.repeated:
                        log.info("turn %d: the reply repeated a sentence; stopped there", message.turn)
                        break
            except ReplyFailed as error:
                failed = True
                log.error("turn %d: the reply stopped: %s", message.turn, error)
                yield Metric(message.turn, "llm_error", 1.0, {"event": "llm_error", "error": str(error)})
                break
            finally:
                pieces.close()  # type: ignore[attr-defined]  - stops generation when the runner cancels
            if not calls or self._toolbox is None or splitter.repeated:
                break
            if round_ == MAX_TOOL_ROUNDS:
                log.warning("turn %d: still calling tools after %d rounds; stopping", message.turn, round_)
                break
            results = [self._toolbox.run(call, context.log_content) for call in calls]
            for result in results:
                yield Metric(message.turn, "tool_call", result.seconds,
                             {"event": "tool_call", "tool": result.call.name, "arguments": result.call.arguments,
                              "result": result.output, "error": result.error})
            messages = [*messages, *self.tool_messages(calls, results)]
        if not failed:  # after a failure the unfinished sentence is dropped rather than spoken half
            for piece in thoughts.finish():  # text held back in case it began a tag (an unclosed block is dropped)
                yield from speak(piece)
            if capped:  # the token cap may have cut the last word: end at a sentence or a whole word
                splitter.trim()
            for sentence in splitter.finish():
                if text := clean_for_speech(sentence):
                    yield ReplyText(text, message.turn, message.language, plan.spoken, plan.voice)
                    said.append(text)


def _verdict_first(outputs: Iterator[Message], scoring: Aside | None, turn: int) -> Iterator[Message]:
    """A reply's outputs, the words' :class:`TurnVerdict` before the first of them.

    The words are scored beside the reply's first tokens (a backend with a second worker, CTranslate2's
    ``inter_threads``, runs both at once; the other core is idle then), not before them: the verdict still reaches
    the VAD before any reply audio could be heard, which the runner holds until the turn is confirmed anyway.
    """
    try:
        for output in outputs:
            if scoring is not None:
                yield from _verdict(scoring, turn)
                scoring = None
            yield output
    finally:
        outputs.close()  # type: ignore[attr-defined]  # the runner closed this one: the reply stops too
    if scoring is not None:  # a reply that yielded nothing
        yield from _verdict(scoring, turn)


def _verdict(scoring: Aside, turn: int) -> Iterator[Message]:
    probability = scoring.result()
    yield Metric(turn, "words_scoring_s", scoring.seconds)  # its wall time, beside the reply's first tokens
    if probability is not None:
        yield TurnVerdict(turn, probability)
