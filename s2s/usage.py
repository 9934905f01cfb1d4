"""The tokens an LLM used: what one reply (or one round of it) cost, as the backend truly counted it.

Local backends count with their own tokenizer (the rendered prompt in, every generated token out, the end-of-turn
token included); ``llm=openai`` passes on the server's own ``usage``. A reply the runner closes mid-stream
(barge-in, cancel) reports none: its count never came (a server sends it last) or came too late to be yielded.

A backend yields a :class:`Usage` after each streamed round; the LLM stage turns it into one :class:`Metric`
per count (:func:`metrics`), which the Recorder adds up per turn and the realtime server adds to the response the
round belongs to (:func:`from_metric`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from s2s.messages import Metric

# a Usage field -> the metric that carries it (the Recorder adds up every metric named *_tokens in a turn)
METRICS = {"input_tokens": "llm_input_tokens", "output_tokens": "llm_output_tokens",
           "cached_tokens": "llm_cached_tokens"}


@dataclass(frozen=True)
class Usage:
    """Tokens in and out of one generation, or a sum of them.

    Args:
        input_tokens: the prompt's tokens (system prompt, history, the user's words, tools).
        output_tokens: the tokens generated.
        cached_tokens: of ``input_tokens``, those a cache held already (CTranslate2's static system prompt, a
            server's prompt cache); None: the backend does not say.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int | None = None

    def __add__(self, other: Usage) -> Usage:
        cached = None if self.cached_tokens is None and other.cached_tokens is None else \
            (self.cached_tokens or 0) + (other.cached_tokens or 0)
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens, cached)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def as_dict(self) -> dict[str, Any]:
        """The counts as ``GET /v1/sessions`` shows them (``cached_tokens`` only where a backend said)."""
        shown = {"total_tokens": self.total_tokens, "input_tokens": self.input_tokens,
                 "output_tokens": self.output_tokens}
        return shown if self.cached_tokens is None else {**shown, "cached_tokens": self.cached_tokens}


def metrics(turn: int, usage: Usage) -> list[Metric]:
    """One metric per count the backend gave."""
    return [Metric(turn, name, float(value)) for field_name, name in METRICS.items()
            if (value := getattr(usage, field_name)) is not None]


def from_metric(metric: Metric) -> Usage | None:
    """The count a metric of :func:`metrics` carries, as a Usage; None for any other metric."""
    field_name = next((key for key, name in METRICS.items() if name == metric.name), None)
    return None if field_name is None else Usage(**{field_name: int(metric.value)})
