"""History compaction: exchanges the model no longer sees are summarised into one note instead of being forgotten.

The conversation (:class:`s2s.chat_context.ChatContext`) decides when and what: after a reply, when its history
holds exchanges outside the window (``history_turns``, ``history_tokens``), it asks for a summary of those and of
the older half of the window, together with the summary it already has. The LLM stage only writes it
(``LLMStage.summarise``). The summary goes at the end of the system prompt (every chat template takes a system
prompt; a second system message or a summary posing as the user is refused or misread by some).

A summary is written in its own thread, after the reply it follows is done, and gives way to the next reply: the
next turn stops it (at the next token), and the one after that tries again. It never delays a reply; a user who
always speaks before it is done keeps today's behaviour (the window drops the oldest exchanges).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from s2s.usage import Usage

log = logging.getLogger("s2s.compaction")
SUMMARY_MAX_TOKENS = 160  # a summary's length cap (about 120 words); it stays in every later prompt
INSTRUCTIONS = (
    "You keep the memory of a spoken conversation between a user and a voice assistant. Summarise what you are "
    "given in at most five short sentences, in the third person: what the user asked, said or wants (keep names, "
    "numbers, places, dates and preferences) and what the assistant answered or promised. Leave out greetings and "
    "small talk. Write only the summary.")
NOTE = "Earlier in this conversation, in short: "  # what the system prompt says before the summary

# (request messages, stop) -> (the summary, or None when stopped or empty; what writing it cost)
Summarise = Callable[[list[dict[str, Any]], threading.Event], tuple[str | None, Usage | None]]


def request(previous: str | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat that asks the LLM for the summary of ``messages`` (folding in the ``previous`` summary)."""
    lines = [f"{'User' if message['role'] == 'user' else 'Assistant'}: {message['content']}"
             for message in messages if message["role"] in ("user", "assistant") and message["content"]]
    earlier = f"What was summarised before:\n{previous}\n\n" if previous else ""
    conversation = "\n".join(lines)
    return [{"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": f"{earlier}The conversation:\n{conversation}\n\nThe summary:"}]


def with_summary(prompt: str | None, summary: str | None) -> str | None:
    """The system prompt with the summary note at its end (either may be missing)."""
    if not summary:
        return prompt
    note = NOTE + summary
    return f"{prompt}\n\n{note}" if prompt else note


class Compaction:
    """One summary being written in a daemon thread; :meth:`stop` makes it give up at its next token.

    Args:
        summarise: the LLM stage's summary writer.
        messages: the request (:func:`request`).
        done: called in the thread with the summary (None: stopped, failed or empty) and what it cost.
    """

    def __init__(self, summarise: Summarise, messages: list[dict[str, Any]],
                 done: Callable[[str | None, Usage | None], None]) -> None:
        self._summarise, self._messages, self._done = summarise, messages, done
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="s2s-compaction", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, wait_s: float = 0.0) -> None:
        """Give up the summary; ``wait_s``: how long to wait for the thread (a stage being reset or closed)."""
        self.stopped.set()
        if wait_s and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def _run(self) -> None:
        summary, usage = None, None
        try:
            summary, usage = self._summarise(self._messages, self.stopped)
        except Exception as error:  # a backend failing (a server down): the history stays as it is
            log.warning("history compaction failed: %s: %s", type(error).__name__, error)
        summary = summary.strip() if summary and not self.stopped.is_set() else None
        self._done(summary or None, usage)
