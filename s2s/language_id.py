"""The language of a text, for an STT that transcribes several languages but reports none (Parakeet v3).

lingua-language-detector (Apache-2.0; its n-gram models ship inside the wheel, so it runs offline) decides among
the languages the caller names, and says nothing when it is unsure: a text shorter than ``MIN_CHARS`` (a "Merci"
is French, Italian or Spanish to it), or one whose best two languages are closer than ``MIN_DISTANCE``. The caller
then keeps the language it had.

Low-accuracy mode (trigrams only): on 42 conversational sentences in 13 languages it was as right as the
high-accuracy mode (42/42), and on 39 of 20-45 characters 37 against 38, while the high-accuracy models take about
700 MB of memory and 12 s to load on a 2-core machine (40 MB and 0.2 s here). High accuracy is better only on
texts shorter than ``MIN_CHARS``, which are not judged.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from s2s.sharing import shared_model

log = logging.getLogger(__name__)

MIN_CHARS = 20  # shorter texts keep the last language: "Ja bitte", "Merci", "Okay" name no language reliably
MIN_DISTANCE = 0.1  # lingua's minimum relative distance: closer than this between the best two, it names none
_WARM_TEXTS = ("What would you like to talk about today?", "Bonjour, je peux vous aider avec cette question.",
               "Guten Tag, ich helfe Ihnen gerne weiter.", "Это предложение готовит определение языка.")


class TextLanguage:
    """Names the language of a text among ``languages`` (codes as :mod:`s2s.languages` writes them).

    Loads lingua's models (the caller has checked that lingua is installed). A code lingua has no model for
    (Maltese) is left out, and such text is named as its nearest language; Norwegian (``no``) is its Bokmål.
    """

    def __init__(self, languages: Sequence[str]) -> None:
        from lingua import IsoCode639_1

        codes = []
        for code in languages:
            try:
                codes.append(IsoCode639_1.from_str(_LINGUA.get(code, code)))
            except ValueError:
                log.info("language detection: lingua has no model for %r", code)
        self._detector: Any = shared_model(("lingua", tuple(sorted(c.name for c in codes))), lambda: _build(codes))

    def detect(self, text: str) -> str | None:
        """The text's language code, or None when the text is too short or lingua is unsure."""
        text = text.strip()
        if len(text) < MIN_CHARS:
            return None
        found = self._detector.detect_language_of(text)
        if found is None:
            return None
        code = found.iso_code_639_1.name.lower()
        return _OURS.get(code, code)


_LINGUA = {"no": "nb"}  # our code -> lingua's
_OURS = {value: key for key, value in _LINGUA.items()}


def _build(codes: list[Any]) -> Any:
    """A detector with its models loaded and run once, so the first turn pays nothing."""
    from lingua import LanguageDetectorBuilder

    detector = (LanguageDetectorBuilder.from_iso_codes_639_1(*codes).with_low_accuracy_mode()
                .with_minimum_relative_distance(MIN_DISTANCE).with_preloaded_language_models().build())
    for text in _WARM_TEXTS:
        detector.detect_language_of(text)
    return detector
