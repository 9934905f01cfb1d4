"""The keywords every chat LLM stage takes, each stated once with its one range; the constructors name them.

A constructor's signature is its option's schema (s2s/schema.py reads it), so an annotation written five times
drifted five ways (``history_turns`` was ``Range(0)`` in two backends and ``Range(0, 1000)`` in two others). The
defaults a user sees are conf/llm/_chat_base.yaml's; a test keeps the constructors' own equal to them.
"""
from __future__ import annotations

from typing import Annotated

from s2s.config_errors import OneOf, Range
from s2s.languages import WHISPER_LANGUAGES

HistoryTurns = Annotated[int, Range(0, 1000)]  # previous exchanges the model sees again
HistoryTokens = Annotated[int, Range(1)] | None  # their token budget; None: only the turn count
FirstChunkWords = Annotated[int, Range(0)]  # the reply's first TTS chunk ends at a clause or after this many words
FirstChunkMinWords = Annotated[int, Range(1)]  # ... but never fewer
ReplyLanguage = Annotated[str, OneOf(WHISPER_LANGUAGES)] | None  # what replies are in (None: unknown)
MaxNewTokens = Annotated[int, Range(1, 4096)]  # a reply's token cap (local models)
Temperature = Annotated[float, Range(0, 5)]  # sampling temperature of a local model (0: greedy)
RepetitionPenalty = Annotated[float, Range(1, 2)]  # on the reply's own tokens (local models)
Threshold = Annotated[float, Range(0, 1)] | None  # a calibration threshold (unsure_below, dont_know_below)
CompactHistory = bool  # exchanges past the history budget are summarised by the LLM instead of dropped
Thinking = bool | None  # a thinking model's enable_thinking (Qwen3-style chat templates); None: the model's default
