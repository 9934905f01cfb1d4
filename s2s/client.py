"""A client for the realtime server: ``python -m s2s.client --url ws://HOST:PORT/v1/realtime``.

- ``--file question.wav --out reply.wav``: streams the file (any rate, mono or stereo) as the user's speech,
  writes every reply's audio into one WAV file and prints what was heard and said; exit code 0 when every
  reply completed.
- Without ``--file``: talks through the microphone and speaker (sounddevice); the reply stops playing when the
  server says the user started speaking again. Ctrl-C ends it.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from s2s import audio

RATE = 24000
CHUNK_S = 0.1
_HINT = "use --file question.wav --out reply.wav instead"


class ClientError(RuntimeError):
    """One line for the user: what went wrong and what to do."""


def _connect(url: str, api_key: str | None) -> Any:
    try:
        from websockets.asyncio.client import connect
    except ImportError:
        raise ClientError("the client needs the websockets package: pip install -e '.[server]'") from None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return connect(url, additional_headers=headers, max_size=None, open_timeout=30)


def _pcm(samples: np.ndarray) -> str:
    return base64.b64encode(audio.float_to_int16(samples).astype("<i2").tobytes()).decode("ascii")


def _session_update(args: argparse.Namespace) -> dict[str, Any]:
    session: dict[str, Any] = {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm",
                                                                                   "rate": args.rate}},
                                                             "output": {"format": {"type": "audio/pcm",
                                                                                   "rate": args.rate}}}}
    if args.instructions:
        session["instructions"] = args.instructions
    if args.voice:
        session["audio"]["output"]["voice"] = args.voice
    return {"type": "session.update", "session": session}


class Received:
    """What came back: transcripts, replies, their audio, voice-to-voice on the client's clock."""

    def __init__(self) -> None:
        self.audio: list[np.ndarray] = []
        self.heard: list[str] = []
        self.said: list[str] = []
        self.statuses: list[str] = []
        self.errors: list[str] = []
        self.first_audio_at: float | None = None
        self.last_event_at = time.monotonic()

    def on_event(self, event: dict[str, Any], quiet: bool = False) -> None:
        kind = event.get("type")
        self.last_event_at = time.monotonic()
        if kind == "response.output_audio.delta":
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic()
            self.audio.append(audio.int16_to_float(np.frombuffer(base64.b64decode(event["delta"]), dtype="<i2")))
        elif kind == "conversation.item.input_audio_transcription.completed":
            self.heard.append(event["transcript"])
            quiet or print(f"you:       {event['transcript']}", flush=True)
        elif kind == "response.output_audio_transcript.done":
            self.said.append(event["transcript"])
            quiet or print(f"assistant: {event['transcript']}", flush=True)
        elif kind == "response.done":
            self.statuses.append(event["response"]["status"])
            if event["response"]["status"] != "completed":
                quiet or print(f"(reply {event['response']['status']})", flush=True)
        elif kind == "error":
            self.errors.append(f"{event['error'].get('code')}: {event['error'].get('message')}")
            quiet or print(f"server error: {self.errors[-1]}", file=sys.stderr, flush=True)


async def run_file(args: argparse.Namespace) -> int:
    """Send a speech file, wait until the server has answered every turn, write the replies."""
    samples = audio.read_audio(args.file, args.rate)
    samples = np.concatenate([samples, audio.silence(args.trailing_silence, args.rate)])
    received = Received()
    async with _connect(args.url, args.api_key) as socket:
        first = json.loads(await socket.recv())
        if first.get("type") == "error":
            raise ClientError(f"the server refused the session: {first['error'].get('message')}")
        await socket.send(json.dumps(_session_update(args)))

        async def receive() -> None:
            async for frame in socket:
                received.on_event(json.loads(frame))

        receiver = asyncio.create_task(receive())
        step = int(CHUNK_S * args.rate)
        start = time.monotonic()
        for index, offset in enumerate(range(0, len(samples), step)):
            await socket.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": _pcm(samples[offset:offset + step])}))
            if args.realtime:
                await asyncio.sleep(max(0.0, start + (index + 1) * CHUNK_S - time.monotonic()))
        # done when every reply ended and the server has been quiet for a moment (or on timeout)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and not receiver.done():
            replies_pending = len(received.heard) > len(received.statuses)
            if not replies_pending and received.statuses and time.monotonic() - received.last_event_at > 1.5:
                break
            if not replies_pending and not received.heard and time.monotonic() - start > args.timeout / 2:
                break  # nothing heard at all
            await asyncio.sleep(0.05)
        receiver.cancel()
    if args.out:
        import soundfile

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        reply = np.concatenate(received.audio) if received.audio else np.zeros(0, dtype=np.float32)
        soundfile.write(args.out, audio.float_to_int16(reply), args.rate, subtype="PCM_16")
        print(f"reply audio: {args.out} ({len(reply) / args.rate:.2f} s)", flush=True)
    if not received.heard:
        print("error: the server heard no speech in the file", file=sys.stderr)
        return 1
    return 0 if received.statuses and all(s == "completed" for s in received.statuses) else 1


async def run_live(args: argparse.Namespace) -> int:
    """Microphone to the server, server to the speaker, until Ctrl-C."""
    from s2s.io.sound import AudioDeviceError, import_sounddevice

    try:
        sounddevice = import_sounddevice("the client")
    except AudioDeviceError as error:
        raise ClientError(f"{error}".replace("source=file source.path=<speech.wav> and/or sink=file", _HINT))
    loop = asyncio.get_running_loop()
    captured: asyncio.Queue[np.ndarray] = asyncio.Queue()
    playback: list[np.ndarray] = []

    def on_input(indata: np.ndarray, frames: int, when: Any, status: Any) -> None:
        loop.call_soon_threadsafe(captured.put_nowait, indata[:, 0].copy())

    def on_output(outdata: np.ndarray, frames: int, when: Any, status: Any) -> None:
        out = np.zeros(frames, dtype=np.float32)
        filled = 0
        while playback and filled < frames:
            block = playback[0]
            take = min(len(block), frames - filled)
            out[filled:filled + take] = block[:take]
            filled += take
            if take == len(block):
                playback.pop(0)
            else:
                playback[0] = block[take:]
        outdata[:, 0] = out

    try:
        mic = sounddevice.InputStream(samplerate=args.rate, channels=1, dtype="float32", callback=on_input,
                                      blocksize=int(CHUNK_S * args.rate), device=args.input_device)
        speaker = sounddevice.OutputStream(samplerate=args.rate, channels=1, dtype="float32", callback=on_output,
                                           device=args.output_device)
        mic.start()
        speaker.start()
    except Exception as error:  # PortAudioError, or ValueError for an unknown device
        raise ClientError(f"the client: no usable audio device ({error}); {_HINT}") from None
    received = Received()
    try:
        async with _connect(args.url, args.api_key) as socket:
            first = json.loads(await socket.recv())
            if first.get("type") == "error":
                raise ClientError(f"the server refused the session: {first['error'].get('message')}")
            await socket.send(json.dumps(_session_update(args)))
            print("listening; speak (Ctrl-C ends)", flush=True)

            async def send() -> None:
                while True:
                    block = await captured.get()
                    await socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": _pcm(block)}))

            sender = asyncio.create_task(send())
            try:
                async for frame in socket:
                    event = json.loads(frame)
                    if event.get("type") == "input_audio_buffer.speech_started":
                        playback.clear()  # the user talks over the reply: stop playing it now
                    before = len(received.audio)
                    received.on_event(event)
                    if len(received.audio) > before:
                        playback.append(received.audio[-1])
            finally:
                sender.cancel()
    finally:
        mic.stop()
        speaker.stop()
        mic.close()
        speaker.close()
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m s2s.client") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8765/v1/realtime", help="the server's realtime endpoint")
    parser.add_argument("--api-key", default=os.environ.get("S2S_API_KEY"),
                        help="sent as 'Authorization: Bearer <key>' (default: $S2S_API_KEY)")
    parser.add_argument("--file", type=Path, help="speak this file instead of the microphone")
    parser.add_argument("--out", type=Path, help="with --file: write the replies' audio here (WAV)")
    parser.add_argument("--realtime", action="store_true", help="with --file: send at the pace of speech")
    parser.add_argument("--rate", type=int, default=RATE, help="PCM16 rate both ways (default 24000)")
    parser.add_argument("--instructions", help="the assistant's instructions for this session")
    parser.add_argument("--voice", help="a voice of the server's TTS")
    parser.add_argument("--timeout", type=float, default=120.0, help="with --file: give up after this many s")
    parser.add_argument("--trailing-silence", type=float, default=1.5, help="with --file: silence sent after it")
    parser.add_argument("--input-device", default=None, help="sounddevice input device (index or name)")
    parser.add_argument("--output-device", default=None, help="sounddevice output device (index or name)")
    args = parser.parse_args(argv)
    for name in ("input_device", "output_device"):  # "3" means device index 3
        value = getattr(args, name)
        if isinstance(value, str) and value.isdigit():
            setattr(args, name, int(value))
    if args.file is not None and not args.file.is_file():
        parser.error(f"--file {args.file}: no such file")
    try:
        return asyncio.run(run_file(args) if args.file is not None else run_live(args))
    except ClientError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # connection refused, unknown host
        print(f"error: cannot reach {args.url}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # websockets' InvalidStatus (401 for a wrong key), a closed connection
        print(f"error: {args.url}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
