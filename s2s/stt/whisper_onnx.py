"""Whisper's greedy decode on onnxruntime, with the rules CTranslate2's ``generate`` applies for faster-whisper.

``stt.cpu_decoder=onnxruntime`` (:class:`s2s.stt.faster_whisper.FasterWhisperSTT`): CTranslate2 still makes the
features' encoding (and any beam search); this module decodes greedily from it on the models
:mod:`s2s.stt.whisper_onnx_build` made, with:

- the suppressed tokens at every step (``suppress_blank`` needs nothing more: the first token is a timestamp);
- Whisper's timestamp rules: the first token a timestamp of at most ``first_timestamp`` steps (1 s), timestamps
  in pairs and never going back, and a timestamp wherever all of them together are likelier than the likeliest
  word;
- the average log-probability per token (the end counted) and the probability of ``<|nospeech|>`` at the start,
  as faster-whisper reads them from CTranslate2's result.

On the 12 real recordings the words were CTranslate2's on every one, and the decode took 0.67x as long (an AVX2
EPYC, one thread, 10 s window).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from s2s.onnx import cache_layout, cpu_session
from s2s.stt.whisper_onnx_build import OUTPUTS


@dataclass(frozen=True)
class Greedy:
    """One greedy decode: the tokens after the prompt (the end excluded), their average log-probability (the end
    counted: faster-whisper's ``avg_logprob``) and the chance of no speech."""
    tokens: list[int]
    confidence: float
    no_speech: float


@dataclass(frozen=True)
class Vocabulary:
    """The special tokens the rules use (from faster-whisper's tokenizer)."""
    start: int  # <|startoftranscript|>
    end: int  # <|endoftext|>
    no_speech: int
    no_timestamps: int
    first_timestamp: int  # <|0.00|>: every later id is a timestamp


class GreedyDecoder:
    """The two onnxruntime sessions of a built folder (shared while the server shares weights)."""

    def __init__(self, onnxruntime: Any, folder: Path, threads: int | None) -> None:
        self.cross, self.step = (cpu_session(onnxruntime, folder / name, threads) for name in OUTPUTS)
        self.layers, self.heads, self.size = cache_layout(self.step)

    def decode(self, encoded: np.ndarray, prompt: list[int], vocabulary: Vocabulary, suppressed: list[int],
               longest: int, first_timestamp: int) -> Greedy:
        """Greedy tokens after ``prompt`` over the encoder's output ``encoded`` ([1, frames, width]), at most
        ``longest`` of them."""
        cross = self.cross.run(None, {"encoder_output": np.ascontiguousarray(encoded, dtype=np.float32)})
        empty = np.zeros((1, self.heads, 0, self.size), np.float32)
        feed: dict[str, Any] = {}
        for layer in range(self.layers):
            feed[f"cross_k_{layer}"], feed[f"cross_v_{layer}"] = cross[2 * layer], cross[2 * layer + 1]
            feed[f"past_k_{layer}"] = feed[f"past_v_{layer}"] = empty
        suppressed_ids = np.array(sorted(set(suppressed) | {vocabulary.no_timestamps}), np.int64)
        given, past, tokens, total, no_speech = list(prompt), 0, [], 0.0, 0.0
        while True:
            count = len(given)
            feed.update(tokens=np.array([given], np.int64),
                        positions=np.arange(past, past + count, dtype=np.int64)[None],
                        mask=np.triu(np.full((count, past + count), -np.inf, np.float32), k=past + 1))
            logits, *cache = self.step.run(None, feed)
            for layer in range(self.layers):
                feed[f"past_k_{layer}"], feed[f"past_v_{layer}"] = cache[2 * layer], cache[2 * layer + 1]
            if not past:
                no_speech = _chance(logits[0, prompt.index(vocabulary.start)], vocabulary.no_speech)
            past += count
            scores = logits[0, -1]
            scores[suppressed_ids] = -np.inf
            _timestamp_rules(scores, tokens, vocabulary, first_timestamp)
            top = scores.max()
            token = int(scores.argmax())
            total += float(scores[token] - (top + np.log(np.exp(scores - top, dtype=np.float64).sum())))
            if token == vocabulary.end:
                break
            tokens.append(token)
            if len(tokens) >= longest:
                break
            given = [token]
        return Greedy(tokens, total / (len(tokens) + 1), no_speech)


def _chance(logits: np.ndarray, token: int) -> float:
    """softmax(``logits``)[``token``]."""
    exp = np.exp(logits.astype(np.float64) - logits.max())
    return float(exp[token] / exp.sum())


def _timestamp_rules(scores: np.ndarray, tokens: list[int], vocabulary: Vocabulary, first_timestamp: int) -> None:
    """Whisper's rules on the next token's ``scores`` (in place) after ``tokens``, as OpenAI's decoder and
    CTranslate2 apply them."""
    stamps = vocabulary.first_timestamp
    if not tokens:  # the first token: a timestamp, at most first_timestamp steps in
        scores[:stamps] = -np.inf
        scores[stamps + first_timestamp + 1:] = -np.inf
    else:
        last = tokens[-1] >= stamps
        before_last = len(tokens) < 2 or tokens[-2] >= stamps
        if last and before_last:  # a pair closed: a word or the end next
            scores[stamps:] = -np.inf
        elif last:  # a timestamp opened: its pair or the end next
            scores[:vocabulary.end] = -np.inf
        earlier = [token for token in tokens if token >= stamps]
        if earlier:  # never back in time (a pair may repeat its opening timestamp)
            scores[stamps:earlier[-1] + (0 if last and not before_last else 1)] = -np.inf
    times = scores[stamps:]
    top = times.max()
    if np.isfinite(top) and top + np.log(np.exp(times - top).sum()) > scores[:stamps].max():
        scores[:stamps] = -np.inf  # all timestamps together likelier than any word
