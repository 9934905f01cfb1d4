"""``python -m s2s.bench bba``: Big Bench Audio's scoring on known replies, its data layout, and a run of the
command against our real server (the embedded default) on espeak-ng questions in the dataset's layout."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from s2s import audio
from s2s.bench.bba import Capture, Question, Settings, _result, ask_all, load_questions, session_update
from s2s.bench.bba_scoring import Result, aggregate, extract_answer, official, summarize, table

# (id, category, official answer, question): one of each category, short enough for espeak and two cores
ESPEAK_SET = [
    (11, "formal_fallacies", "valid", "All cats are mammals. Tom is a cat. So Tom is a mammal. Is the argument "
                                      "valid or invalid?"),
    (22, "navigate", "Yes", "Take two steps forward, then two steps back. Do you return to the start?"),
    (33, "object_counting", "4", "I have a piano, two flutes and a violin. How many instruments do I have?"),
    (44, "web_of_lies", "No", "Fidel lies. Jerry says Fidel tells the truth. Does Jerry tell the truth?"),
]


@pytest.mark.parametrize(("category", "reply", "expected"), [
    ("navigate", "Two steps forward, two back: I am where I began. Final answer: Yes.", ("yes", "marker")),
    ("web_of_lies", "Fidel lies, so Jerry lies too, and the answer is not yes.", ("no", "marker")),  # negated
    ("navigate", "Final answer: No, not yes.", ("no", "marker")),  # the first candidate after the marker
    ("object_counting", "My answer is 3. Wait, two flutes count twice. Final answer: four", ("4", "marker")),
    ("object_counting", "A piano, two flutes and a violin make 4.", ("4", "scan")),
    ("object_counting", "There are twelve of them.", ("12", "scan")),
    ("formal_fallacies", "Final answer: in-valid", ("invalid", "marker")),
    ("formal_fallacies", "The conclusion does not follow, so it is not deductively valid.", ("invalid", "scan")),
    ("formal_fallacies", "I'm not sure this is valid.", ("valid", "scan")),  # the negation is not on the word
    ("navigate", "Yes, it looks that way at first, but then no.", ("no", "scan")),  # the last one, with no marker
    ("navigate", "No return. The answer is: 1.", ("no", "scan")),  # nothing gradable after the marker
    ("navigate", "Final answer: " + "x" * 70 + " yes", ("yes", "scan")),  # past the marker's 60 characters
    ("navigate", "The answer is a number.", (None, None)),
    ("navigate", "   ", (None, None)),
    ("sports_understanding", "Yes.", (None, None)),  # not a category of the dataset
])
def test_answers_are_extracted_as_the_reference_extracts_them(category, reply, expected):
    assert extract_answer(category, reply) == expected


def test_grades_count_errors_and_unparsed_replies_against_the_system():
    assert official("object_counting", " 07 ") == "7" and official("navigate", "Yes") == "yes"
    right = Result(1, "navigate", "Yes", reply="Final answer: yes", first_audio_s=1.0, turn_s=3.0).grade()
    wrong = Result(2, "object_counting", "4", reply="Final answer: 5", first_audio_s=2.0, turn_s=4.0).grade()
    unparsed = Result(3, "web_of_lies", "No", reply="Who knows.", first_audio_s=3.0, turn_s=5.0).grade()
    errored = Result(4, "navigate", "No", reply="Final answer: no", error="split_turn (2 responses)").grade()
    assert (right.correct, wrong.correct, unparsed.correct, errored.correct) == (True, False, None, True)
    totals = summarize([right, wrong, unparsed, errored])
    assert totals == {"n": 4, "errors": 1, "parsed": 3, "correct": 1, "accuracy": 0.25, "accuracy_parsed": 1 / 3,
                      "parse_rate": 0.75}
    scores = aggregate([right, wrong, unparsed, errored])
    assert scores["by_category"]["navigate"]["n"] == 2 and scores["by_category"]["navigate"]["correct"] == 1
    assert scores["first_audio_s"] == {"p50": 2.0, "p95": pytest.approx(2.9)}
    assert scores["turn_s"]["p50"] == 4.0
    shown = table(scores)
    assert "| all | 4 | 1 | 25% | 3 | 75% | 1 |" in shown and "| navigate | 2 | 1 | 50% | 2 | 100% | 1 |" in shown
    assert "p50 2.00 s, p95 2.90 s" in shown


def _folder(tmp_path: Path, lines: list[object]) -> Path:
    import soundfile

    (tmp_path / "data").mkdir(exist_ok=True)
    for name in ("a.wav", "b.wav", "c.wav"):
        soundfile.write(tmp_path / "data" / name, audio.silence(0.1, 16000), 16000)
    (tmp_path / "metadata.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return tmp_path


def test_the_data_folder_is_checked_before_anything_is_asked(tmp_path):
    def line(number, category, name="data/a.wav"):
        return {"id": number, "category": category, "official_answer": "Yes", "file_name": name}

    folder = _folder(tmp_path, [line(1, "navigate"), line(2, "navigate"), line(3, "web_of_lies", "data/b.wav"),
                                line(4, "object_counting", "data\\/c.wav")])
    assert [q.id for q in load_questions(folder)] == [1, 2, 3, 4]
    # a short run takes each category in turn, in the file's order
    assert [q.id for q in load_questions(folder, limit=3)] == [1, 4, 3]
    assert load_questions(folder)[3].path == (folder / "data" / "c.wav").resolve()
    with pytest.raises(ValueError, match="no metadata.jsonl"):
        load_questions(tmp_path / "data")
    for bad, message in [(line(5, "sports"), "category 'sports' is not one of formal_fallacies"),
                         (line(6, "navigate", "../outside.wav"), "is not a file inside"),
                         (line(7, "navigate", "data/missing.mp3"), "is not a file inside"),
                         ({"id": 8, "category": "navigate"}, r"metadata.jsonl:2: not a question")]:
        with pytest.raises(ValueError, match=message):
            load_questions(_folder(tmp_path, [line(1, "navigate"), bad]))
    with pytest.raises(ValueError, match="--limit 0"):
        load_questions(_folder(tmp_path, [line(1, "navigate")]), limit=0)


def test_the_session_declares_the_rate_it_is_sent_at():
    update = session_update(Settings(silence_ms=700))["session"]
    assert update["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert update["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert update["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 700
    assert "Final answer: X" in update["instructions"] and "under 120 words" in update["instructions"]


def _captured(events: list[dict]) -> Capture:
    capture = Capture()
    for event in events:
        capture.take(event)
    return capture


def test_a_reply_is_read_from_the_server_events_and_a_split_question_is_an_error():
    question = Result(1, "navigate", "Yes")
    reply = [{"type": "input_audio_buffer.speech_started", "item_id": "item_1"},
             {"type": "conversation.item.input_audio_transcription.completed", "transcript": "Do you return?"},
             {"type": "response.created"},
             {"type": "response.output_audio_transcript.delta", "delta": "Final answer: "},
             {"type": "response.output_audio.delta", "delta": "AAAA"},
             {"type": "response.output_audio_transcript.delta", "delta": "Yes."},
             {"type": "response.done", "response": {"status": "completed"}}]
    capture = _captured(reply)
    result = _result(question, capture, spoken_end=capture.responses[0].first_audio_at - 1.0)
    assert (result.reply, result.heard, result.extracted, result.correct, result.error) == (
        "Final answer: Yes.", "Do you return?", "yes", True, None)
    assert result.first_audio_s == pytest.approx(1.0) and result.turn_s >= result.first_audio_s
    split = _captured([*reply, {"type": "input_audio_buffer.speech_started", "item_id": "item_2"}])
    assert split.error == "split_turn (2 input items)"
    twice = _result(Result(1, "navigate", "Yes"), _captured([*reply, *reply[2:]]), None)
    assert twice.error == "split_turn (2 responses)" and twice.first_audio_s is None
    silent = _result(Result(1, "navigate", "Yes"), _captured([e for e in reply if "audio.delta" not in e["type"]]),
                     None)
    assert silent.error == "no_audio_output" and silent.correct is True  # graded, but the error counts it out
    cancelled = _captured([*reply[:3], {"type": "response.done", "response": {"status": "cancelled"}}])
    assert _result(Result(1, "navigate", "Yes"), cancelled, None).error == "response_cancelled"
    assert _result(Result(1, "navigate", "Yes"), Capture(), None).error == "no_response"


def test_a_question_that_cannot_be_asked_is_an_errored_row_and_the_run_goes_on(tmp_path):
    pytest.importorskip("websockets")
    folder = _folder(tmp_path, [{"id": 1, "category": "navigate", "official_answer": "Yes",
                                 "file_name": "data/a.wav"}])
    (folder / "data" / "broken.mp3").write_bytes(b"not audio")
    good = load_questions(folder)[0]
    broken = Question(2, "web_of_lies", "No", folder / "data" / "broken.mp3")
    nobody = "ws://127.0.0.1:9/v1/realtime"  # the discard port: nothing listens, the connection is refused
    results = asyncio.run(ask_all(nobody, None, [broken, good], Settings(connect_timeout_s=5)))
    assert results[0].error.startswith("audio_load_failed: ") and results[0].extracted is None
    assert results[1].error.startswith("ConnectionRefusedError") and results[1].reply == ""
    assert summarize(results)["errors"] == 2


def test_a_folder_not_in_the_layout_is_refused_before_a_server_starts(tmp_path):
    result = subprocess.run([sys.executable, "-m", "s2s.bench", "bba", "--data", str(tmp_path)], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no metadata.jsonl" in result.stderr
    assert not (tmp_path / "outputs").exists()


@pytest.fixture(scope="module")
def espeak_set(tmp_path_factory, espeak):
    """ESPEAK_SET in the dataset's layout: metadata.jsonl and data/question_<id>.mp3, as the hub has it."""
    import soundfile

    folder = tmp_path_factory.mktemp("big_bench_audio")
    (folder / "data").mkdir()
    lines = []
    for number, category, answer, text in ESPEAK_SET:
        wav = espeak(text, folder / f"{number}.wav", rate=170)
        samples, rate = soundfile.read(wav)
        soundfile.write(folder / "data" / f"question_{number}.mp3", samples, rate, format="MP3")
        wav.unlink()
        lines.append(json.dumps({"id": number, "category": category, "official_answer": answer,
                                 "file_name": f"data/question_{number}.mp3"}))
    (folder / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def test_the_command_asks_our_default_server_and_scores_its_real_replies(espeak_set, tmp_path):
    """The embedded default (SmolLM2-135M) cannot be asked for right answers; the scoring of what it said can."""
    pytest.importorskip("websockets")
    bench = subprocess.Popen([sys.executable, "-m", "s2s.bench", "bba", "--data", str(espeak_set), "--grace", "1"],
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = bench.communicate(timeout=480)  # about 40 s on 2 quiet cores
    except subprocess.TimeoutExpired:
        bench.terminate()  # SIGTERM: the bench stops the server it started
        stdout, stderr = bench.communicate(timeout=60)
        pytest.fail("the bench took over 480 s:\n" + stdout[-3000:] + stderr[-3000:])
    assert bench.returncode == 0, stdout[-3000:] + stderr[-3000:]
    [report] = tmp_path.glob("outputs/*/*-bba/bba.json")
    document = json.loads(report.read_text())
    items = [Result(**item) for item in document["items"]]
    assert [item.id for item in items] == [number for number, *_ in ESPEAK_SET]
    assert all(item.error is None and item.reply.strip() for item in items), document["items"]
    assert all(0 < item.first_audio_s <= item.turn_s for item in items), document["items"]
    # the server heard the questions (24 kHz, declared): most of each question's words in most transcripts
    heard = [len(_words(item.heard) & _words(text)) / len(_words(text)) for item, (*_, text) in zip(items, ESPEAK_SET)]
    assert sum(share >= 0.6 for share in heard) >= 3, [item.heard for item in items]
    for item in items:  # what was stored is the scoring of the reply that came back
        assert (item.extracted, item.method) == extract_answer(item.category, item.reply)
    assert document["scores"] == json.loads(json.dumps(aggregate(items)))
    assert set(document["scores"]["by_category"]) == {category for _, category, *_ in ESPEAK_SET}
    assert document["settings"]["input_rate"] == 24000
    assert "| all | 4 |" in stdout and "end of speech -> first reply audio: p50" in stdout
    assert (report.parent / "server" / "s2s.log").is_file()


def test_a_bench_ended_by_sigterm_stops_the_server_it_started(tmp_path):
    """A timeout or a job runner ends a bench with SIGTERM: its server must not outlive it."""
    import signal
    import urllib.request

    code = ("import sys, time\nfrom pathlib import Path\nfrom s2s.bench.server import served\n"
            "with served(None, 1, ['llm=echo'], Path(sys.argv[1])) as url:\n"
            "    print(url, flush=True)\n    time.sleep(120)\n")
    bench = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "server")], cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        url = bench.stdout.readline().strip()  # the server is listening
        assert url.startswith("ws://127.0.0.1:"), url
        health = url.replace("ws://", "http://").replace("/v1/realtime", "/health")
        with urllib.request.urlopen(health, timeout=10) as response:
            assert response.status == 200
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if bench.poll() is None:
            bench.kill()
    with pytest.raises(OSError):  # nothing listens there any more
        urllib.request.urlopen(health, timeout=5)
