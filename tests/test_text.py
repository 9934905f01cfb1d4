"""The streaming sentence splitter: real sentence ends (pysbd), a short first chunk, a stop on repetition."""
from __future__ import annotations

import random
import re

import pytest

from s2s.llm.echo import EchoLM
from s2s.messages import ReplyText, Transcript, TurnEnd
from s2s.text import SentenceSplitter, clean_for_speech, normalise, sentence_ends

TRICKY = "Dr. Smith paid $3.50 for the U.S. map. It was e.g. cheap! Really?"
TRICKY_SENTENCES = ["Dr. Smith paid $3.50 for the U.S. map.", "It was e.g. cheap!", "Really?"]


def bpe_like(text: str) -> list[str]:
    """Pieces the way a GPT-style tokenizer streams them: ' Smith', ' $', '3', '.', '50', ..."""
    return re.findall(r"\s?\w+|\s?[^\w\s]|\s+", text)


def chunkings(text: str) -> dict[str, list[str]]:
    rng = random.Random(7)
    cuts = sorted(rng.sample(range(1, len(text)), 12))
    return {
        "tokens": bpe_like(text),
        "characters": list(text),
        "words": re.findall(r"\s*\S+", text),
        "whole": [text],
        "random": [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])],
        "tokens with trailing spaces": [piece + " " for piece in text.split(" ")],
    }


def stream(splitter: SentenceSplitter, pieces: list[str]) -> list[tuple[int, str]]:
    """(index of the piece that released it, chunk) for every chunk, the finish counting as one more piece."""
    out = [(index, chunk) for index, piece in enumerate(pieces) for chunk in splitter.feed(piece)]
    return out + [(len(pieces), chunk) for chunk in splitter.finish()]


@pytest.mark.parametrize("how", list(chunkings(TRICKY)))
def test_abbreviations_and_numbers_do_not_end_a_sentence(how):
    chunks = [chunk for _, chunk in stream(SentenceSplitter(first_chunk_words=0), chunkings(TRICKY)[how])]
    assert chunks == TRICKY_SENTENCES


@pytest.mark.parametrize("how", list(chunkings(TRICKY)))
def test_short_first_chunk_then_whole_sentences(how):
    chunks = [chunk for _, chunk in stream(SentenceSplitter(first_chunk_words=6), chunkings(TRICKY)[how])]
    # six words, then the rest of that sentence (on its own, however short), then whole sentences
    assert chunks == ["Dr. Smith paid $3.50 for the", "U.S. map.", "It was e.g. cheap!", "Really?"]


def test_a_sentence_is_released_as_soon_as_the_next_one_begins():
    pieces = bpe_like("The capital of France is Paris. It is a lovely city.")
    released = stream(SentenceSplitter(first_chunk_words=0), pieces)
    assert released[0] == (pieces.index(" It"), "The capital of France is Paris.")
    assert released[1] == (len(pieces), "It is a lovely city.")


@pytest.mark.parametrize(("text", "first"), [
    ("Well, you see, the capital of France is Paris.", "Well, you see,"),  # first clause with enough words
    ("Yes, the capital of France is Paris.", "Yes, the capital of France is"),  # "Yes," alone is too short
    ("It is Paris. The city is lovely in spring.", "It is Paris."),  # a short whole sentence
    ("It costs 3,500 dollars, which is a lot.", "It costs 3,500 dollars,"),  # a comma inside a number is no clause
    ("The answer is simple: always be kind to others.", "The answer is simple:"),
    ("Paris is the capital and the largest city of France.", "Paris is the capital and the"),  # six words
])
def test_first_chunk_ends_at_a_clause_or_after_a_few_words(text, first):
    for pieces in (bpe_like(text), list(text)):
        chunks = [chunk for _, chunk in stream(SentenceSplitter(first_chunk_words=6, first_chunk_min_words=3), pieces)]
        assert chunks[0] == first
        assert " ".join(chunks) == text
        # later chunks are whole sentences (or the rest of the first one): none ends inside a clause
        assert all(chunk[-1] in ".!?" for chunk in chunks[1:])


def test_the_rest_of_a_first_sentence_cut_early_goes_as_soon_as_it_ends():
    """However short, it is not held back to be joined with the next sentence (a stream may die in between)."""
    pieces = bpe_like("The first sentence is complete. The second one never")
    released = stream(SentenceSplitter(first_chunk_words=4), pieces)
    assert [chunk for _, chunk in released] == ["The first sentence is", "complete.", "The second one never"]
    assert released[1][0] == pieces.index(" The", 1)  # released when the next sentence began


def test_only_the_first_chunk_is_cut_early():
    text = "Sure, I can help. Paris, the capital, is lovely, and so is Lyon, in the south. Nice, too."
    chunks = [chunk for _, chunk in stream(SentenceSplitter(first_chunk_words=6), bpe_like(text))]
    assert chunks == ["Sure, I can help.", "Paris, the capital, is lovely, and so is Lyon, in the south.", "Nice, too."]


def test_cjk_sentence_ends():
    text = "今天天气很好，我们去公园散步吧。你觉得这个主意怎么样呢？那我们现在就出发吧！"
    expected = ["今天天气很好，我们去公园散步吧。", "你觉得这个主意怎么样呢？", "那我们现在就出发吧！"]
    for pieces in (list(text), [text], [text[i:i + 3] for i in range(0, len(text), 3)]):
        assert [chunk for _, chunk in stream(SentenceSplitter(first_chunk_words=6), pieces)] == expected


def test_an_unfinished_stream_confirms_no_boundary():
    assert sentence_ends("It was made in the U.S.") == []
    assert sentence_ends("It costs $3.") == []
    assert sentence_ends("Hello there. It") == [12]
    assert sentence_ends("Hello there. It", final=True) == [12, 15]


def test_a_repeated_sentence_stops_the_reply():
    loop = "I'm glad to have you here. It is nice. I'm glad to have you here! I'm glad to have you here."
    for pieces in (bpe_like(loop), [loop]):
        splitter = SentenceSplitter(first_chunk_words=0, stop_on_repeat=True)
        assert [chunk for _, chunk in stream(splitter, pieces)] == ["I'm glad to have you here.", "It is nice."]
        assert splitter.repeated and splitter.text.strip() == "I'm glad to have you here. It is nice."
        assert list(splitter.feed(" More text.")) == []  # nothing after the repeat


def test_a_repeat_of_a_first_sentence_cut_early_is_caught():
    loop = "I am glad to have you here today. I am glad to have you here today. Bye."
    splitter = SentenceSplitter(first_chunk_words=6, stop_on_repeat=True)
    assert [chunk for _, chunk in stream(splitter, bpe_like(loop))] == ["I am glad to have you", "here today."]
    assert splitter.repeated


def test_without_stop_on_repeat_everything_is_spoken():
    text = "Yes it is here. Yes it is here."
    assert [c for _, c in stream(SentenceSplitter(), bpe_like(text))] == ["Yes it is here.", "Yes it is here."]


def test_normalise_ignores_case_punctuation_and_spacing():
    assert normalise("I'm  glad, to have you HERE!") == normalise("i m glad to have you here.") == "i m glad to have you here"


def test_llm_stage_stops_a_looping_reply():
    """The shared LLMStage streaming (here through the echo LLM) ends a reply at a repeated sentence."""
    loop = "I'm glad to have you here. I'm glad to have you here. I'm glad to have you here."
    out = list(EchoLM(first_chunk_words=0).process(Transcript(loop, 2, "en")))
    assert [m.text for m in out if isinstance(m, ReplyText)] == ["I'm glad to have you here."]
    assert out[-1] == TurnEnd(2)


def test_llm_stage_sends_a_short_first_chunk():
    text = "Well, the capital of France is Paris, a city on the Seine. It is lovely."
    out = list(EchoLM().process(Transcript(text, 0, "en")))
    assert [m.text for m in out if isinstance(m, ReplyText)] == \
        ["Well, the capital of", "France is Paris, a city on the Seine.", "It is lovely."]  # "Well," is too short


def test_streams_in_several_threads_do_not_mix():
    """The realtime server runs one LLM stage per session, each in its own thread."""
    import threading

    texts = {i: f"Reply number {i} is here. Dr. Smith paid ${i}.50 for it. It was e.g. cheap! Really?" for i in range(4)}
    results: dict[int, list[str]] = {}

    def run(i: int) -> None:
        results[i] = [chunk for _ in range(20) for _, chunk in stream(SentenceSplitter(), bpe_like(texts[i]))]

    threads = [threading.Thread(target=run, args=(i,)) for i in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in texts:
        assert results[i] == [f"Reply number {i} is here.", f"Dr. Smith paid ${i}.50 for it.", "It was e.g. cheap!",
                              "Really?"] * 20


@pytest.mark.parametrize(("markdown", "spoken"), [
    ("**Paris** is *lovely* and __very big__, _truly_.", "Paris is lovely and very big, truly."),
    ("***Both*** at once, **bold with *italic* inside**.", "Both at once, bold with italic inside."),
    ("# Heading", "Heading."),
    ("## Steps to take ##", "Steps to take."),
    ("### Done!", "Done!"),
    ("Fruit:\n- apples\n- **pears**\n* plums", "Fruit: apples, pears, plums."),
    ("1. Boil the water.\n2. Add salt\n3) Stir", "Boil the water. Add salt, Stir."),
    ("See [the docs](https://example.com/a_b) and ![a chart](chart.png).", "See the docs and a chart."),
    ("> A quoted line", "A quoted line"),
    ("```python\nprint(1)\n```", "print(1)"),
    ("Above\n\n---\n\nbelow", "Above below"),
    ("| City | Country |\n|---|:---:|\n| Paris | France |", "City, Country. Paris, France."),
    ("~~old~~ new", "old new"),
    (r"Use \*stars\* literally", "Use *stars* literally"),
    ("Nice 😀 work ✨", "Nice work"),
])
def test_markdown_is_spoken_as_plain_speech(markdown, spoken):
    assert clean_for_speech(markdown) == spoken


@pytest.mark.parametrize("text", [
    "2 * 3 = 6", "2*3*4 is 24", "a_b and snake_case_name", "x^2 + y^2 = r^2", "#1 in the charts", "__init__ runs",
    "It costs $3.50 - a bargain.", "5 > 3 and 2 < 4", "Use a + b or a - b.",
])
def test_arithmetic_and_identifiers_keep_their_sense(text):
    assert clean_for_speech(text) == text


def test_inline_code_keeps_its_text():
    assert clean_for_speech("Call `foo_bar()` then `a * b * c`.") == "Call foo_bar() then a * b * c."
    assert clean_for_speech("Run ``x = y_z**2``.") == "Run x = y_z**2."


def test_emphasis_cut_across_streamed_chunks_loses_its_markers():
    """The first chunk may end inside bold text: each half drops its unpaired stars, arithmetic keeps its own."""
    text = "**The capital of France** is Paris, and 2 * 3 = 6. Next, *try this* out."
    chunks = [clean_for_speech(chunk) for _, chunk in stream(SentenceSplitter(first_chunk_words=3), bpe_like(text))]
    assert chunks[0] == "The capital of"
    assert " ".join(chunks) == "The capital of France is Paris, and 2 * 3 = 6. Next, try this out."


def test_llm_stage_speaks_a_markdown_list_as_items():
    reply = "Here are three:\n\n* **Paris** - the capital\n* **Lyon** - the food\n* **Nice** - the sea\n\nWant more?"
    out = list(EchoLM(first_chunk_words=0).process(Transcript(reply, 1, "en")))
    spoken = " ".join(m.text for m in out if isinstance(m, ReplyText))
    assert spoken == "Here are three: Paris - the capital. Lyon - the food. Nice - the sea. Want more?"
