"""Calibrated answers (llm.unsure_below / llm.dont_know_below) on a tiny random LM through llm=ctranslate2 and
llm=transformers, the token cap's trim to a whole word, and the answer benchmark's three-way scorer on fixed
replies."""
from __future__ import annotations

import pytest

from conftest import CACHE
from s2s.bench.answer_set import ANSWER_SET, Question, verdict
from s2s.bench.unsure_sweep import calibrated
from s2s.llm.calibration import DONT_KNOW, UNSURE_PREFIX, Calibrator, Confidence, asks, hedged
from s2s.llm.base import LLMStage
from s2s.llm.ctranslate2_lm import CTranslate2LM
from s2s.llm.transformers_lm import TransformersLM
from s2s.messages import Metric, ReplyText, Transcript
from s2s.text import SentenceSplitter
from tests.fixtures import tiny_lm

MODELS = CACHE / "models"


@pytest.fixture(scope="module")
def random_lm():
    """A random-weight tiny LM folder: its token probabilities are low and it never stops on its own."""
    from s2s.models import build_once

    return build_once(MODELS / "tiny-lm-random-0", lambda out: tiny_lm.build(out), "random tiny LM")


BACKENDS = ("ctranslate2", "transformers")


def stage_on(folder, backend: str = "ctranslate2", **options) -> LLMStage:
    """The tiny LM in float32 through ``backend``: the same weights, so the same greedy tokens either way."""
    common = {"model": str(folder), "device": "cpu", "system_prompt": None, "repetition_penalty": 2.0,
              "cache_dir": str(MODELS), "max_new_tokens": 24, **options}
    stage = CTranslate2LM(compute_type="float32", **common) if backend == "ctranslate2" else \
        TransformersLM(dtype="float32", **common)
    stage.threads = 1
    stage.setup()
    return stage


def reply(stage: LLMStage, text: str) -> tuple[str, list[Metric]]:
    stage.reset()
    messages = list(stage.process(Transcript(text, 0, "en")))
    return (" ".join(m.text for m in messages if isinstance(m, ReplyText)),
            [m for m in messages if isinstance(m, Metric) and m.name == "llm_confidence"])


QUESTIONS = ("what is hello world", "tell me a story", "how many legs", "is it a good morning")  # replies with words


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_threshold_above_every_probability_hedges_every_reply_and_zero_none(random_lm, backend):
    for options, hedges in (({"unsure_below": 1.0}, True), ({"unsure_below": 0.0}, False), ({}, False)):
        stage = stage_on(random_lm, backend, **options)
        try:
            for question in QUESTIONS:
                text, [confidence] = reply(stage, question)
                assert text.startswith(UNSURE_PREFIX) == hedges, (options, text)
                assert 0 < confidence.extra["min"] <= confidence.extra["mean"] < 1 and 0 < confidence.value < 5
                assert confidence.extra["verdict"] == ("unsure" if hedges else "sure")
        finally:
            stage.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_very_low_confidence_is_replaced_by_i_dont_know(random_lm, backend):
    stage = stage_on(random_lm, backend, unsure_below=1.0, dont_know_below=1.0)
    try:
        for question in QUESTIONS:
            assert reply(stage, question)[0] == DONT_KNOW
            assert stage.context.history()[-1]["content"] == DONT_KNOW  # what was said is what the model sees next
    finally:
        stage.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reply_cut_by_the_token_cap_ends_at_a_whole_word(random_lm, backend):
    long = stage_on(random_lm, backend, max_new_tokens=200)
    try:
        full = {question: reply(long, question) and long.context.history()[-1]["content"] for question in QUESTIONS}
    finally:
        long.close()
    for cap in (5, 9, 14, 23):
        stage = stage_on(random_lm, backend, max_new_tokens=cap)
        try:
            for question in QUESTIONS:
                reply(stage, question)
                kept = stage.context.history()[-1]["content"]
                assert full[question].startswith(kept), (cap, kept, full[question])
                after = full[question][len(kept):]
                # what was dropped begins a new word (or the cut word went altogether)
                assert not kept or not after or not after[0].isalnum() or not kept[-1].isalnum(), (cap, kept)
        finally:
            stage.close()


def test_both_backends_measure_the_same_confidence_of_the_same_reply(random_lm):
    """One rule (s2s.llm.calibration) on the same float32 weights: the same replies, the same probabilities."""
    measured = {}
    for backend in BACKENDS:
        stage = stage_on(random_lm, backend, unsure_below=0.5)
        try:
            measured[backend] = [reply(stage, question) for question in QUESTIONS]
        finally:
            stage.close()
    for (ours, [our_confidence]), (theirs, [their_confidence]) in zip(*measured.values()):
        assert ours == theirs
        ours, theirs = our_confidence.extra, their_confidence.extra
        assert (ours["tokens"], ours["verdict"]) == (theirs["tokens"], theirs["verdict"])
        assert (ours["mean"], ours["min"]) == pytest.approx((theirs["mean"], theirs["min"]), rel=1e-3)


def test_the_splitter_trims_a_capped_tail_to_its_last_sentence_or_word():
    def capped(text: str) -> list[str]:
        splitter = SentenceSplitter(first_chunk_words=4)
        out = list(splitter.feed(text))
        splitter.trim()
        return [*out, *splitter.finish()]

    assert capped("The moon landing was on July 20th, 196cederadio") == ["The moon landing was", "on July 20th"]
    assert capped("It was in 1969. The landing was on July 20th, 196ced") == ["It was in 1969."]
    assert capped("The landing was in July. It was a Sunday.") == ["The landing was in", "July.", "It was a Sunday."]
    assert capped("Parisxq") == []


def test_the_calibrator_measures_what_the_reply_adds_not_the_echoed_question():
    calibrator = Calibrator(0.5, None, "min", question="What's the capital of France?")
    out = []
    for text, probability in ((" The", 0.99), (" capital", 0.99), (" of", 0.99), (" France", 0.99), (" is", 0.9),
                              (" Lyon", 0.2), (".", 0.9), (" It", 0.9)):
        out += calibrator.feed(text, __import__("math").log(probability))
    [confidence] = [piece for piece in out if isinstance(piece, Confidence)]
    assert confidence.tokens == 2 and confidence.min == pytest.approx(0.2) and confidence.verdict == "unsure"
    assert "".join(piece for piece in out if isinstance(piece, str)) == \
        "I'm not sure, but I think the capital of France is Lyon. It"
    assert hedged("I think so.") == "I'm not sure, but I think I think so." and hedged("NASA did.").endswith("NASA did.")


def test_only_words_that_ask_get_a_hedged_reply():
    for text in ("What is the capital of France?", "capital of France?", "how many legs does a spider have",
                 "Tell me a joke.", "Name a planet.", "Is it raining"):
        assert asks(text), text
    for text in ("Thank you.", "Good morning.", "I trust you had an historic evening.", "Hello there!", ""):
        assert not asks(text), text


@pytest.mark.parametrize("backend", BACKENDS)
def test_thanks_and_greetings_are_never_hedged_whatever_the_confidence(random_lm, backend):
    stage = stage_on(random_lm, backend, unsure_below=1.0, dont_know_below=1.0)
    try:
        for text in ("hello world", "good morning"):  # the random LM says words to these
            said, [confidence] = reply(stage, text)
            assert said and not said.startswith(UNSURE_PREFIX) and said != DONT_KNOW, said
            assert confidence.extra["verdict"] == "sure"  # measured, not acted on
    finally:
        stage.close()


def test_the_scorer_tells_right_from_confidently_wrong_from_unsure():
    president = Question("Who was the first president of the United States?", ("washington",), ("kennedy",))
    assert verdict("George Washington was.", president) == "right"
    assert verdict("The first president was John F. Kennedy.", president) == "wrong"
    assert verdict("Washington, or maybe Kennedy.", president) == "wrong"  # a known wrong fact spoils it
    assert verdict("I'm not sure, but I think it was Kennedy.", president) == "unsure"
    assert verdict("I'm not sure, but I think it was Washington.", president) == "unsure"  # told to doubt it
    assert verdict("I don't know that one.", president) == "unsure"
    assert verdict("Abraham Lincoln.", president) == "wrong"
    author = Question("Who wrote Romeo and Juliet?", ("shakespeare",))
    assert verdict("It is William Shakespeare\u2019s play.", author) == "right"
    legs = Question("How many legs does a spider have?", ("eight", "8"))
    assert verdict("It has 8 legs.", legs) == "right" and verdict("It has 18 legs.", legs) == "wrong"
    unknown = Question("What number am I thinking of?", ("read your mind",), kind="unknown")
    assert verdict("I can't read your mind!", unknown) == "right" and verdict("I dont know.", unknown) == "right"
    assert verdict("You are thinking of 7.", unknown) == "wrong"
    assert calibrated("Paris.", {"mean": 0.3, "min": 0.1}, "mean", 0.5, None) == "I'm not sure, but I think paris."
    assert calibrated("Paris.", {"mean": 0.3, "min": 0.1}, "min", 0.5, 0.2) == DONT_KNOW
    assert calibrated("Paris.", None, "mean", 0.5, 0.2) == "Paris."


def test_the_answer_set_has_every_kind_with_a_hundred_questions_or_more():
    kinds = {question.kind for question in ANSWER_SET}
    assert len(ANSWER_SET) >= 100 and kinds == {"fact", "number", "arithmetic", "advice", "follow_up", "decline",
                                                 "unknown"}
    assert all(question.right and len(question.turns) == (2 if question.kind == "follow_up" else 1)
               for question in ANSWER_SET)
    assert len({question.ask for question in ANSWER_SET}) == len(ANSWER_SET)


@pytest.mark.slow
def test_calibration_turns_confident_mistakes_of_smollm2_into_hedges():
    """The packaged SmolLM2 on the whole answer set with the default threshold, 24-token replies (the hedge is
    decided within the first sentence, where a fact's key word is), one run: a hedged reply is also scored without
    its hedge, which is the reply an uncalibrated run gives (but for a follow-up's history). Aggregates with a
    margin. Measured on one thread with the 4-token window, confidently wrong plain -> calibrated, right lost,
    unsure gained: 60 -> 35, 1, 26 (an AMD EPYC's AVX-512); 69 -> 35, 0, 30 (AVX); 61 -> 38, 0, 23 (GENERIC);
    float32 57 -> 37, 1, 21. A few minutes."""
    from conftest import compose_config

    from s2s.bench.answers import StreamClock, ask

    llm = compose_config(["llm=ctranslate2"]).llm
    stage = CTranslate2LM(system_prompt=llm.system_prompt, compute_type="int8", unsure_below=llm.unsure_below,
                          max_new_tokens=24)
    stage.threads = 1
    stage.setup()
    try:
        clock = StreamClock(stage)
        stage.stream = clock
        replies = [ask(stage, clock, question)["reply"] for question in ANSWER_SET]
    finally:
        stage.close()
    counts = {}
    for name, texts in (("plain", [text.removeprefix(f"{UNSURE_PREFIX} ") for text in replies]),
                        ("calibrated", replies)):
        verdicts = [verdict(text, question) for text, question in zip(texts, ANSWER_SET)]
        counts[name] = {kind: verdicts.count(kind) for kind in ("right", "wrong", "unsure")}
    plain, calibrated_ = counts["plain"], counts["calibrated"]
    assert calibrated_["wrong"] <= plain["wrong"] - 10, counts
    assert calibrated_["right"] >= plain["right"] - 4, counts
    assert calibrated_["unsure"] >= plain["unsure"] + 10, counts
