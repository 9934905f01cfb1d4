"""What ``turn=words`` and ``turn=fused`` read from a transcript: whether its words could end a sentence.

The LLM stage scores the words with the marks Whisper closed them with taken off (:func:`s2s.text.bare_words`),
and sums its model's probability of the tokens that would end them (:func:`sentence_end_ids`).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from s2s.text import closes_sentence


def sentence_end_ids(tokenizer: Any, end_of_turn: Iterable[int]) -> list[int]:
    """Ids of the tokens that end a sentence after a word: those that start with "." "?" or "!" (not an ellipsis;
    with or without the tokenizer's space or newline marks), and the end-of-turn tokens."""
    size = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    ends = set(end_of_turn)
    for index, token in enumerate(tokenizer.tokens(list(range(size)))):
        text = (token or "").replace("\u0120", " ").replace("\u010a", "\n").strip()
        if closes_sentence(text):
            ends.add(index)
    return sorted(ends)
