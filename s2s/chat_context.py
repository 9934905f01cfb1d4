"""One conversation: the system prompt, the history by turn, the client's edits, each turn's plan, the tools, the
summary of what it compacted (s2s/compaction.py) and the tokens it has cost.

The conversation belongs to whoever talks: a local run has one, and each realtime session owns its own. The
LLM stage is lent one (``LLMStage.context``) and reads and writes only that, so a pooled pipeline carries
nothing of a session over to the next one: the session's context goes with the session (LiveKit's
``ChatContext`` is the model for this).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from s2s.compaction import Compaction, Summarise, request
from s2s.usage import Usage

log = logging.getLogger("s2s.compaction")
KEEP: Any = object()  # an option not given: the owner's own setting holds (the stage's tools, the system prompt)


@dataclass(frozen=True)
class TurnPlan:
    """What one turn is asked to do (:meth:`ChatContext.take_plan`).

    Args:
        instructions: its own system prompt (None: none; KEEP: the context's, else the stage's).
        toolbox: its own tools (None: none; KEEP: the context's, else the stage's).
        remember: whether the exchange stays in the history.
        spoken: whether the reply is said aloud.
        voice: the voice it is said in (None: the TTS's own).
        max_tokens: the reply's token cap when lower than the stage's own (None: the stage's).
    """

    instructions: Any = KEEP
    toolbox: Any = KEEP
    remember: bool = True
    spoken: bool = True
    voice: str | None = None
    max_tokens: int | None = None


class ChatContext:
    """The history (exchanges by turn, edits kept) and what the next turns are asked to do.

    Thread-safe: a server edits it from its own thread while the LLM's thread reads it.

    Args:
        system_prompt: the instructions every turn starts with (None: none; KEEP: the LLM stage's configured
            ``system_prompt``, until a client gives its own).
        log_content: whether what was said (and tool arguments) may reach the log: a local run's user owns it;
            a server's operator sees it only when ``server.log_transcripts`` is on.
    """

    def __init__(self, system_prompt: Any = KEEP, log_content: bool = True) -> None:
        self.system_prompt = system_prompt
        self.log_content = log_content
        self.tools: Any = KEEP  # a Toolbox, None (no tools) or KEEP: the stage's own llm.tools
        self.spoken = True  # replies are said aloud; False: text only (output_modalities ["text"])
        self.max_tokens: int | None = None  # every reply's token cap when lower than the stage's (None: the stage's)
        self._messages: list[dict[str, Any]] = []
        self._owners: list[int] = []  # the turn each message belongs to
        self._plans: dict[int, dict[str, Any]] = {}  # turn -> what its TurnPlan sets
        self._edits: dict[tuple[int, str], str | None] = {}  # (turn, role) -> what the client kept (None: deleted)
        self.summary: str | None = None  # what compaction made of the exchanges it took out of the history
        self._usage = Usage()  # every token the LLM spent on this conversation (replies, attempts, summaries)
        self._compaction: Compaction | None = None  # the summary being written
        self._lock = threading.Lock()

    def plan_turn(self, turn: int, instructions: Any = KEEP, toolbox: Any = KEEP, remember: bool = True,
                  spoken: Any = KEEP, voice: str | None = None, max_tokens: Any = KEEP) -> None:
        """Options for ``turn`` alone: its own instructions (None: no system prompt), its own tools (None: none),
        whether the exchange stays in the history (a realtime client's out-of-band response does not), whether
        the reply is said aloud, in which voice (None: the TTS's own) and its token cap (None: the stage's)."""
        with self._lock:
            self._plans[turn] = {"instructions": instructions, "toolbox": toolbox, "remember": remember,
                                 "spoken": spoken, "voice": voice, "max_tokens": max_tokens}

    def take_plan(self, turn: int) -> TurnPlan:
        """``turn``'s plan, once; what it left at KEEP is the context's (spoken, max_tokens) or the stage's."""
        with self._lock:
            planned = self._plans.pop(turn, {})
            defaults = {"spoken": self.spoken, "max_tokens": self.max_tokens}
        return TurnPlan(**{**planned, **{key: value for key, value in defaults.items()
                                         if planned.get(key, KEEP) is KEEP}})

    def edit(self, turn: int, role: str, content: str | None) -> None:
        """The client changed its copy of the conversation: ``role``'s message of ``turn`` now says ``content``.

        None deletes it. The edit also holds when the turn is remembered later (a reply still being cut short
        in the LLM's thread), so what the client was left with is what the model sees next.
        """
        with self._lock:
            self._edits[(turn, role)] = content
            self._apply_edits(turn)

    def remember(self, turn: int, user_text: str, reply: str) -> None:
        """Put one exchange into the history, replacing what ``turn`` had there (e.g. a reply cut short)."""
        with self._lock:
            self._forget(turn)
            self._messages += [{"role": "user", "content": user_text}, {"role": "assistant", "content": reply}]
            self._owners += [turn, turn]
            self._apply_edits(turn)

    def add(self, turn: int, role: str, content: str) -> None:
        """One message a client brought (a system note, an earlier assistant reply) as ``turn`` of the history."""
        with self._lock:
            self._messages.append({"role": role, "content": content})
            self._owners.append(turn)
            self._apply_edits(turn)

    def discard(self, turn: int) -> None:
        """Forget ``turn``: a speculative attempt the user spoke over leaves nothing in the history."""
        with self._lock:
            self._forget(turn)

    def history(self, turns: int | None = None) -> list[dict[str, Any]]:
        """The last ``turns`` exchanges kept (None: all of them), oldest first."""
        with self._lock:
            kept = self._messages if turns is None else self._messages[-2 * turns:] if turns > 0 else []
            return [dict(message) for message in kept]

    def window(self, turns: int, tokens: int | None, count_tokens: Callable[[str], int]) -> list[dict[str, Any]]:
        """What a model sees again: the newest exchanges that fit both ``turns`` and ``tokens`` (None: no token
        budget; ``count_tokens`` measures), oldest first; the oldest go first, a whole exchange at a time."""
        with self._lock:
            kept = set(self._recent(turns, tokens, count_tokens))
            return [dict(message) for message, owner in zip(self._messages, self._owners) if owner in kept]

    def count(self, usage: Usage) -> None:
        """Add what one generation for this conversation cost."""
        with self._lock:
            self._usage += usage

    @property
    def usage(self) -> Usage:
        """Every token the LLM spent on this conversation so far."""
        with self._lock:
            return self._usage

    def compact(self, turns: int, tokens: int | None, count_tokens: Callable[[str], int],
                summarise: Summarise) -> bool:
        """Start summarising the history if it passed its budget; True when a summary is now being written.

        When exchanges lie outside the window of ``turns`` and ``tokens``, those and the older half of the
        window (all but the newest exchanges within half of each budget) are summarised in a thread, with the
        summary so far; the result replaces them. One summary at a time. The history is left alone when it
        changed meanwhile (a client's edit, a reply cut short), when the summary was stopped
        (:meth:`cancel_compaction`) or failed: the next reply tries again.
        """
        with self._lock:
            if self._compaction is not None and self._compaction.running:
                return False
            if len(self._recent(turns, tokens, count_tokens)) == len(set(self._owners)):
                return False  # everything still fits
            keep = set(self._recent(-(-turns // 2), None if tokens is None else -(-tokens // 2), count_tokens))
            covered = [(dict(message), owner) for message, owner in zip(self._messages, self._owners)
                       if owner not in keep]
            previous = self.summary
            job = Compaction(summarise, request(previous, [message for message, _ in covered]),
                             lambda summary, usage: self._compacted(covered, previous, summary, usage))
            self._compaction = job
        job.start()
        return True

    def cancel_compaction(self, wait_s: float = 0.0) -> None:
        """Stop a summary being written (a new turn is about to be answered); ``wait_s``: wait for its thread."""
        with self._lock:
            job = self._compaction
        if job is not None:
            job.stop(wait_s)

    def _compacted(self, covered: list[tuple[dict[str, Any], int]], previous: str | None, summary: str | None,
                   usage: Usage | None) -> None:
        """A summary of ``covered`` is done (None: none came): it replaces them if they are still as they were."""
        turns = {owner for _, owner in covered}
        with self._lock:
            if usage is not None:
                self._usage += usage
            now = [(message, owner) for message, owner in zip(self._messages, self._owners) if owner in turns]
            if summary is None or self.summary != previous or now != covered:
                return
            kept = [index for index, owner in enumerate(self._owners) if owner not in turns]
            self._messages = [self._messages[index] for index in kept]
            self._owners = [self._owners[index] for index in kept]
            self.summary = summary
        log.info("history: %d exchanges summarised into %d characters", len(turns), len(summary))

    def _recent(self, turns: int, tokens: int | None, count_tokens: Callable[[str], int]) -> list[int]:
        """The turns of the newest exchanges within both budgets, oldest first (the caller holds the lock)."""
        recent = list(dict.fromkeys(self._owners))[-turns:] if turns > 0 else []
        if tokens is None:
            return recent
        budget, fits = tokens, []  # the newest exchanges that fit; the first that does not ends it
        for turn in reversed(recent):
            budget -= sum(count_tokens(str(message["content"] or ""))
                          for message, owner in zip(self._messages, self._owners) if owner == turn)
            if budget < 0:
                break
            fits.append(turn)
        return fits[::-1]

    def _apply_edits(self, turn: int) -> None:
        kept_messages, kept_owners = [], []
        for message, owner in zip(self._messages, self._owners):
            content = self._edits.get((owner, message["role"]), message["content"]) if owner == turn else \
                message["content"]
            if content is not None:
                kept_messages.append({**message, "content": content})
                kept_owners.append(owner)
        self._messages, self._owners = kept_messages, kept_owners

    def _forget(self, turn: int) -> None:
        kept = [index for index, owner in enumerate(self._owners) if owner != turn]
        self._messages = [self._messages[index] for index in kept]
        self._owners = [self._owners[index] for index in kept]
