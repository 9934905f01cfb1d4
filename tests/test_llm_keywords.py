"""The keywords every chat LLM stage shares are stated once (s2s/llm/keywords.py): one range each, everywhere."""
from __future__ import annotations

import typing

import pytest

from s2s.llm import keywords
from s2s.llm.ctranslate2_lm import CTranslate2LM
from s2s.llm.echo import EchoLM
from s2s.llm.mlx_lm import MLXLM
from s2s.llm.openai_lm import OpenAILM
from s2s.llm.transformers_lm import TransformersLM

SHARED = {"history_turns": keywords.HistoryTurns, "history_tokens": keywords.HistoryTokens,
          "first_chunk_words": keywords.FirstChunkWords, "first_chunk_min_words": keywords.FirstChunkMinWords,
          "language": keywords.ReplyLanguage}
LOCAL = {"max_new_tokens": keywords.MaxNewTokens, "temperature": keywords.Temperature}


@pytest.mark.parametrize("stage", [CTranslate2LM, TransformersLM, OpenAILM, MLXLM, EchoLM])
def test_every_llm_stage_states_the_shared_keywords_with_the_one_annotation(stage):
    hints = typing.get_type_hints(stage.__init__, include_extras=True)
    shared = {**SHARED, **(LOCAL if stage in (CTranslate2LM, TransformersLM, MLXLM) else {})}
    for name, annotation in shared.items():
        if name in hints:
            assert hints[name] == annotation, (stage.__name__, name, hints[name])
    assert "history_turns" in hints or stage is EchoLM
