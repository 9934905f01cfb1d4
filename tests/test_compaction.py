"""History compaction: what passes the history budget is summarised by the LLM instead of dropped.

The tiny ``memory`` LM (tests/fixtures/llm_models.py) is trained on the request s2s.compaction makes and answers
the name question from the summary in its system prompt, or says it does not know without it: the local backends
run their real generation code on it. The rules of the mechanism (when a summary applies, when it gives way) use
a summary writer of the test's own, given to the context as the stage gives its ``summarise``.
"""
from __future__ import annotations

import threading
import time

import pytest

from conftest import CACHE, compose_config
from s2s.chat_context import ChatContext
from s2s.compaction import NOTE
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.llm.echo import EchoLM
from s2s.messages import ReplyText, Transcript
from s2s.usage import Usage
from tests.fixtures import llm_models

MODELS = CACHE / "models"


def spoken(out) -> str:
    return " ".join(m.text for m in out if isinstance(m, ReplyText))


def wait_for_summary(context: ChatContext, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while context.summary is None and time.monotonic() < deadline:
        time.sleep(0.05)


def memory_stage(backend: str, compact: bool):
    options = {"system_prompt": None, "history_turns": 1, "max_new_tokens": 24, "temperature": 0.0,
               "compact_history": compact, "unsure_below": None}
    model = str(llm_models.chat_lm("memory", MODELS))
    if backend == "ctranslate2":
        from s2s.llm.ctranslate2_lm import CTranslate2LM

        stage = CTranslate2LM(model=model, device="cpu", compute_type="float32", cache_dir=str(MODELS), **options)
    else:
        from s2s.llm.transformers_lm import TransformersLM

        stage = TransformersLM(model=model, device="cpu", **options)
    stage.threads = 1
    stage.setup()
    return stage


@pytest.mark.parametrize("backend", ["ctranslate2", "transformers"])
def test_the_model_answers_from_the_summary_of_what_passed_the_budget(backend):
    stage = memory_stage(backend, compact=True)
    try:
        for turn, (said, reply) in enumerate(llm_models.MEMORY):
            assert spoken(stage.process(Transcript(said, turn))) == reply
        context = stage.context
        wait_for_summary(context)  # written after the second reply: the first exchange left the window of 1
        assert context.summary == llm_models.SUMMARY
        assert [m["content"] for m in context.history()] == list(llm_models.MEMORY[1])  # the first is summarised
        replies_usage = context.usage
        assert spoken(stage.process(Transcript(llm_models.QUESTION, 2))) == llm_models.REMEMBERED
        prompt = stage.chat_messages("again")[0]
        assert prompt == {"role": "system", "content": NOTE + llm_models.SUMMARY}
        assert context.usage.output_tokens > replies_usage.output_tokens  # the summary's tokens count too
    finally:
        stage.close()


def test_without_compaction_the_exchange_is_dropped_and_forgotten():
    stage = memory_stage("ctranslate2", compact=False)
    try:
        for turn, (said, _) in enumerate(llm_models.MEMORY):
            list(stage.process(Transcript(said, turn)))
        time.sleep(0.2)
        assert stage.context.summary is None and len(stage.context.history()) == 4  # kept, out of the window
        assert spoken(stage.process(Transcript(llm_models.QUESTION, 2))) == llm_models.FORGOTTEN
    finally:
        stage.close()


def remembered(context: ChatContext, turns: int) -> None:
    for turn in range(turns):
        context.remember(turn, f"question {turn}", f"answer {turn}")


def test_a_summary_covers_the_exchanges_outside_the_window_and_the_older_half_of_it():
    context = ChatContext()
    asked: list[list[dict]] = []

    def summarise(messages, stop):
        asked.append(messages)
        return "S1", Usage(30, 5)

    remembered(context, 4)
    count = lambda text: len(text.split())  # noqa: E731
    assert not context.compact(4, None, count, summarise)  # all four fit: nothing to do
    context.remember(4, "question 4", "answer 4")
    assert context.compact(4, None, count, summarise)
    wait_for_summary(context)
    # five exchanges, a window of four: the newest two stay, the three before them are summarised
    assert [m["content"] for m in context.history()] == ["question 3", "answer 3", "question 4", "answer 4"]
    assert context.summary == "S1" and context.usage == Usage(30, 5)
    request = asked[0][1]["content"]
    assert "User: question 0\nAssistant: answer 0" in request and "question 3" not in request
    # the next one folds the summary in; a token budget triggers it as the turn count does
    context.remember(5, "question 5 again", "answer 5")  # 3 + 2 words: with 4 + 4 before it, over 12
    assert context.compact(4, 12, count, lambda messages, stop: (asked.append(messages) or "S2", None))
    deadline = time.monotonic() + 10
    while context.summary == "S1" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert context.summary == "S2" and "What was summarised before:\nS1" in asked[1][1]["content"]
    assert [m["content"] for m in context.history()] == ["question 5 again", "answer 5"]  # within 12 / 2


def test_the_next_turn_stops_a_summary_being_written_and_nothing_changes():
    llm = EchoLM()
    llm.history_turns = 1
    remembered(llm.context, 3)
    started, stopped = threading.Event(), threading.Event()

    def summarise(messages, stop):
        started.set()
        if stop.wait(10):
            stopped.set()
        return "too late", None

    assert llm.context.compact(1, None, len, summarise)
    assert started.wait(5)
    begun = time.monotonic()
    assert spoken(llm.process(Transcript("next", 3))) == "next"  # the reply does not wait for the summary
    assert stopped.wait(5) and time.monotonic() - begun < 2
    time.sleep(0.1)
    assert llm.context.summary is None and len(llm.context.history()) == 8


def test_a_summary_of_history_that_changed_meanwhile_is_dropped():
    context = ChatContext()
    remembered(context, 3)
    edited = threading.Event()

    def summarise(messages, stop):
        edited.wait(10)
        return "stale", Usage(10, 2)

    assert context.compact(1, None, len, summarise)
    context.edit(0, "assistant", "answer 0, as the client left it")  # a truncation of an exchange it covers
    edited.set()
    deadline = time.monotonic() + 10
    while context.usage == Usage() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert context.summary is None and context.usage == Usage(10, 2)  # its cost counts, its summary does not
    assert context.history()[1]["content"] == "answer 0, as the client left it"


@pytest.mark.parametrize("override,fragment", [
    ("llm.compact_history=often", "llm.compact_history=often: invalid"),
    ("llm=echo +llm.compact_history=true", "llm.compact_history"),
])
def test_the_key_is_validated_before_anything_loads(override, fragment, tmp_path):
    with pytest.raises(ConfigErrors, match=fragment):
        validate(compose_config(override.split(), tmp_path))


@pytest.mark.parametrize("option", ["ctranslate2", "transformers", "mlx_lm", "openai"])
def test_every_chat_backend_takes_the_key_and_it_is_off_by_default(option, tmp_path):
    [spec] = [spec for spec in validate(compose_config([f"llm={option}", "platform=macos"], tmp_path))
              if spec.group == "llm"]
    assert spec.kwargs["compact_history"] is False and spec.build().compact_history is False
