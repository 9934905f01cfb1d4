"""``python -m s2s.bench bba --data FOLDER``: Big Bench Audio, spoken reasoning questions, through a realtime server.

The reference system's (huggingface/speech-to-speech 1.1.0) system test, against any OpenAI-Realtime server:
ours by default (``run.py server=realtime`` on 127.0.0.1 with a generated key, stopped at the end), or
``--url``. One session per question, so no question hears another's history; the session asks for a short
reasoning that closes with "Final answer: X" (the reference's instructions), uses the server's VAD with a long
silence (the recordings pause mid-sentence), and hears the question at the pace of speech, then silence.
Scoring is :mod:`s2s.bench.bba_scoring`.

The data is a folder in the dataset's own layout (``ArtificialAnalysis/big_bench_audio`` on the hub):
``metadata.jsonl`` with one ``{"id", "category", "official_answer", "file_name"}`` a line, ``file_name``
relative to the folder (``data/question_0.mp3``). The audio goes out as PCM16 at 24 kHz, and the session says
so (``audio.input.format.rate``): 24 kHz is the Realtime API's rate, which a server assumes when a client
names none; the reference's runner sends 16 kHz undeclared, which only its own server reads right.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from s2s import audio
from s2s.bench.bba_scoring import CATEGORIES, Result, aggregate, table
from s2s.bench.server import RATE, send_paced, served, speech_end_s
from s2s.server.client_log import quote

INSTRUCTIONS = (
    "You are taking a spoken reasoning test. The user reads one self-contained question aloud. Work through it "
    "briefly out loud, then close with a sentence of exactly the form 'Final answer: X'. Choose X like this: if "
    "the question asks whether an argument is deductively valid, X is the single word valid or invalid; if the "
    "question can be answered yes or no, X is the single word Yes or No; if the question asks how many, X is a "
    "single whole number. Never end without that final sentence. Keep the whole reply under 120 words.")
FIELDS = ("id", "category", "official_answer", "file_name")
RETRY_S = 0.5  # between tries while the server's sessions are all in use (the last question's is being freed)


@dataclass(frozen=True)
class Question:
    id: int
    category: str
    official_answer: str
    path: Path


@dataclass(frozen=True)
class Settings:
    """How each question is asked (the reference's values by default)."""

    instructions: str = INSTRUCTIONS
    silence_ms: int = 900  # server_vad's silence_duration_ms: these recordings pause mid-sentence
    trailing_s: float = 2.0  # silence sent after the question
    reply_timeout_s: float = 180.0  # from the end of the sending to the reply's response.done
    grace_s: float = 2.0  # quiet after response.done before the question counts as answered (a split shows here)
    connect_timeout_s: float = 30.0


def load_questions(folder: Path, limit: int | None = None) -> list[Question]:
    """The dataset folder's questions, every line and file checked before any is asked.

    Args:
        folder: holds ``metadata.jsonl`` and the files it names.
        limit: only this many, taken from each category in turn (in the file's order), so a short run covers
            every category.

    Raises:
        ValueError: the folder is not in the dataset's layout; says which line or file and why.
    """
    metadata = folder / "metadata.jsonl"
    if not metadata.is_file():
        raise ValueError(f"{folder}: no metadata.jsonl; expected the layout of ArtificialAnalysis/big_bench_audio "
                         f"(metadata.jsonl with {', '.join(FIELDS)} a line, and the audio files it names)")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit {limit}: at least 1")
    root, questions = folder.resolve(), []
    for number, line in enumerate(metadata.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{metadata}:{number}"
        try:
            record = json.loads(line)
            question = Question(int(record["id"]), str(record["category"]), str(record["official_answer"]),
                                (root / str(record["file_name"]).replace("\\/", "/")).resolve())
        except (ValueError, TypeError, KeyError):
            raise ValueError(f"{where}: not a question; a line is a JSON object with {', '.join(FIELDS)} "
                             f"(id a whole number)") from None
        if question.category not in CATEGORIES:
            raise ValueError(f"{where}: category {question.category!r} is not one of {', '.join(CATEGORIES)}")
        if not question.path.is_relative_to(root) or not question.path.is_file():
            raise ValueError(f"{where}: {record['file_name']!r} is not a file inside {folder}")
        questions.append(question)
    if not questions:
        raise ValueError(f"{metadata}: no questions")
    if limit is None or limit >= len(questions):
        return questions
    queues = {category: [q for q in questions if q.category == category] for category in CATEGORIES}
    picked: list[Question] = []
    while len(picked) < limit:
        picked += [queue.pop(0) for queue in queues.values() if queue][:limit - len(picked)]
    return picked


def session_update(settings: Settings) -> dict[str, Any]:
    """The session every question gets: the instructions, server VAD, and the rate the audio is sent at."""
    return {"type": "session.update", "session": {
        "type": "realtime", "instructions": settings.instructions,
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE},
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": settings.silence_ms,
                                               "interrupt_response": True}}}}}


@dataclass
class Response:
    transcript: str = ""
    first_audio_at: float | None = None
    done_at: float | None = None


@dataclass
class Capture:
    """What one question's session sent back."""

    responses: list[Response] = field(default_factory=list)
    items: list[str] = field(default_factory=list)  # the user items the VAD opened
    heard: str = ""
    error: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def current(self) -> Response:
        if not self.responses:
            self.responses.append(Response())
        return self.responses[-1]

    def take(self, event: dict[str, Any]) -> None:
        kind = event.get("type", "")
        if kind == "input_audio_buffer.speech_started" and event.get("item_id") not in self.items:
            self.items.append(event.get("item_id", ""))
            if self.responses:  # a second user item once a reply began: the question was split in two
                self.error = f"split_turn ({len(self.items)} input items)"
        elif kind == "conversation.item.input_audio_transcription.completed":
            self.heard = f"{self.heard} {event.get('transcript', '')}".strip()
        elif kind == "response.created":
            self.responses.append(Response())
        elif kind in ("response.output_audio.delta", "response.audio.delta") and event.get("delta"):
            response = self.current()
            response.first_audio_at = response.first_audio_at or time.monotonic()
        elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            self.current().transcript += event.get("delta", "")
        elif kind in ("response.output_audio_transcript.done", "response.output_text.done"):
            self.current().transcript = event.get("transcript") or event.get("text") or self.current().transcript
        elif kind == "response.done":
            self.current().done_at = time.monotonic()
            status = event.get("response", {}).get("status", "completed")
            if status != "completed":
                self.error = f"response_{status}"
        elif kind == "error":
            self.error = str(event.get("error", {}).get("message") or "error event")
        self.changed.set()


async def _open(url: str, api_key: str | None, settings: Settings) -> Any:
    """A session with the benchmark's settings, waiting while the server's sessions are all in use."""
    from websockets.asyncio.client import connect

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + settings.reply_timeout_s

    async def event(socket: Any) -> dict[str, Any]:
        return json.loads(await asyncio.wait_for(socket.recv(), settings.connect_timeout_s))

    while True:
        socket = await connect(url, additional_headers=headers, max_size=None, open_timeout=settings.connect_timeout_s)
        try:
            first = await event(socket)
            if first.get("type") != "error":
                await socket.send(json.dumps(session_update(settings)))
                while (answer := await event(socket)).get("type") != "session.updated":
                    if answer.get("type") == "error":
                        raise RuntimeError(f"session.update refused: {answer['error'].get('message')}")
                return socket
            refusal = first.get("error", {})
            if "session_limit_reached" not in (refusal.get("code"), refusal.get("type")) \
                    or time.monotonic() > deadline:
                raise RuntimeError(f"refused: {refusal.get('message')}")
        except BaseException:
            await socket.close()
            raise
        await socket.close()
        await asyncio.sleep(RETRY_S)


async def ask(url: str, api_key: str | None, question: Question, speech: np.ndarray, settings: Settings) -> Result:
    """One question in a session of its own: its reply, graded, and the turn's timing on this client's clock."""
    result = Result(question.id, question.category, question.official_answer)
    capture = Capture()
    try:
        socket = await _open(url, api_key, settings)
    except Exception as error:  # every failure is a row of the table, and the run goes on
        result.error = f"{type(error).__name__}: {error}"
        return result.grade()

    async def receive() -> None:
        async for frame in socket:
            capture.take(json.loads(frame))

    receiver = asyncio.create_task(receive())
    spoken_end: float | None = None
    try:
        start = await send_paced(socket, np.concatenate([speech, audio.silence(settings.trailing_s, RATE)]))
        spoken_end = start + speech_end_s(speech, RATE)
        deadline = time.monotonic() + settings.reply_timeout_s
        while capture.error is None and not receiver.done():
            settled = bool(capture.responses) and capture.responses[-1].done_at is not None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                capture.error = None if settled else "response_timeout"
                break
            capture.changed.clear()
            try:
                await asyncio.wait_for(capture.changed.wait(), min(settings.grace_s, remaining) if settled
                                       else remaining)
            except TimeoutError:
                if settled:
                    break
    except Exception as error:
        capture.error = capture.error or f"{type(error).__name__}: {error}"
    finally:
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
        await socket.close()
    if receiver.done() and not receiver.cancelled() and receiver.exception() is not None:
        capture.error = capture.error or f"connection: {receiver.exception()}"
    return _result(result, capture, spoken_end)


def _result(result: Result, capture: Capture, spoken_end: float | None) -> Result:
    result.heard, result.error = capture.heard, capture.error
    if not capture.responses:
        result.error = result.error or "no_response"
        return result.grade()
    last = capture.responses[-1]  # a split question's last reply is kept to read, and the split is the error
    result.reply = last.transcript
    if last.first_audio_at is None:
        result.error = result.error or "no_audio_output"
    if len(capture.responses) > 1:
        result.error = result.error or f"split_turn ({len(capture.responses)} responses)"
    if spoken_end is not None:
        if last.first_audio_at is not None and last.first_audio_at >= spoken_end:
            result.first_audio_s = last.first_audio_at - spoken_end
        if last.done_at is not None and last.done_at >= spoken_end:
            result.turn_s = last.done_at - spoken_end
    return result.grade()


async def ask_all(url: str, api_key: str | None, questions: list[Question], settings: Settings) -> list[Result]:
    """Every question in turn, each printed as it is graded."""
    results = []
    for index, question in enumerate(questions, 1):
        try:
            speech = audio.read_audio(question.path, RATE)
        except Exception as error:  # soundfile's own errors: one unreadable file is one errored row
            result = Result(question.id, question.category, question.official_answer,
                            error=f"audio_load_failed: {type(error).__name__}: {error}").grade()
        else:
            result = await ask(url, api_key, question, speech, settings)
        results.append(result)
        verdict = "error" if result.error else {True: "right", False: "wrong", None: "unparsed"}[result.correct]
        first = "-" if result.first_audio_s is None else f"{result.first_audio_s:.2f} s"
        print(f"[{index}/{len(questions)}] {verdict:8} {question.category} #{question.id}: official "
              f"{question.official_answer!r}, extracted {result.extracted!r} ({result.method}), first audio {first}"
              f"{', ' + result.error if result.error else ''}; reply {quote(result.reply)}", flush=True)
    return results


def bench_bba(args: Any) -> int:
    """The command: the questions, a server (started unless ``--url``), the table, and ``bba.json``."""
    from s2s.resolvers import fresh_dir
    from s2s.stage import MissingExtraError, require

    if args.url and args.override:
        raise ValueError("--override applies to the server this command starts; with --url none is started")
    if args.silence_ms < 0 or args.trailing_s < 0 or args.reply_timeout <= 0 or args.grace <= 0:
        raise ValueError("--silence-ms and --trailing-s are at least 0; --reply-timeout and --grace above 0")
    questions = load_questions(args.data, args.limit)  # checked before any server starts
    try:
        require("websockets.asyncio.client", backend="python -m s2s.bench bba", extra="server")
    except MissingExtraError as error:
        print(error, file=sys.stderr)
        return 1
    settings = Settings(silence_ms=args.silence_ms, trailing_s=args.trailing_s, reply_timeout_s=args.reply_timeout,
                        grace_s=args.grace)
    output_dir = Path(fresh_dir(time.strftime("outputs/%Y-%m-%d/%H-%M-%S-bba"))).resolve()  # the server runs elsewhere
    api_key = args.api_key if args.url else secrets.token_hex(16)  # a started server takes no other client
    with served(args.url, 1, args.override, output_dir / "server", api_key) as url:
        started = time.monotonic()
        results = asyncio.run(ask_all(url, api_key, questions, settings))
    scores = aggregate(results)
    server = "given" if args.url else f"started here {' '.join(args.override)}".strip()
    print(f"\nBig Bench Audio: {len(results)} questions from {args.data} against {url} ({server})")
    print(table(scores))
    document = {"data": str(args.data), "url": url, "server_overrides": None if args.url else args.override,
                "settings": {**vars(settings), "input_rate": RATE}, "duration_s": time.monotonic() - started,
                "scores": scores, "items": [result.to_dict() for result in results]}
    (output_dir / "bba.json").write_text(json.dumps(document, indent=2) + "\n")
    print(f"bba.json in {output_dir.resolve()}")
    return 0


def add_arguments(parser: Any) -> None:
    import os

    defaults = Settings()
    parser.add_argument("--data", type=Path, required=True,
                        help="a folder in the dataset's layout: metadata.jsonl and the audio files it names")
    parser.add_argument("--url", help="a realtime server (ws:// or wss://); default: start ours on 127.0.0.1")
    parser.add_argument("--api-key", default=os.environ.get("S2S_API_KEY"),
                        help="with --url (default: $S2S_API_KEY); a started server gets a generated one")
    parser.add_argument("--limit", type=int, help="only N questions, taken from each category in turn")
    parser.add_argument("--override", action="append", default=[],
                        help="a config override for the server it starts (repeatable), e.g. llm.max_new_tokens=160")
    parser.add_argument("--silence-ms", type=int, default=defaults.silence_ms,
                        help=f"server_vad silence_duration_ms (default {defaults.silence_ms})")
    parser.add_argument("--trailing-s", type=float, default=defaults.trailing_s,
                        help=f"silence sent after each question (default {defaults.trailing_s:g} s)")
    parser.add_argument("--reply-timeout", type=float, default=defaults.reply_timeout_s,
                        help=f"seconds to wait for a reply (default {defaults.reply_timeout_s:g})")
    parser.add_argument("--grace", type=float, default=defaults.grace_s,
                        help=f"quiet seconds after a reply before the next question (default {defaults.grace_s:g})")
