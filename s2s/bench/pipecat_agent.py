"""The pipecat side of ``python -m s2s.bench pipecat``: runs INSIDE the pipecat venv (scripts/pipecat-venv.sh).

A pipecat 1.14 pipeline as its own docs build one, local models only::

    input -> WhisperSTTService -> user aggregator (SileroVADAnalyzer, turn strategies) -> OpenAILLMService
          -> TTS -> output -> assistant aggregator

- STT: pipecat's ``WhisperSTTService`` (faster-whisper) on the folder our ``stt=faster_whisper`` resolves to.
- VAD and turn: pipecat's ``SileroVADAnalyzer`` with its default ``VADParams`` (stop_secs 0.2) and its default
  stop strategy, Smart Turn v3 (``LocalSmartTurnAnalyzerV3``); ``--turn speech_timeout`` uses
  ``SpeechTimeoutUserTurnStopStrategy`` (pipecat's silence timeout) instead.
- LLM: pipecat's ``OpenAILLMService`` against the benchmark's local endpoint (:mod:`s2s.bench.chat_server`),
  which serves our LLM stage.
- TTS: a ``TTSService`` that says each text pipecat hands it with our ``PiperTTS`` stage (the same voice, phonemes
  and pause shaping as ``tts=piper``), as pipecat's own ``PiperTTSService`` does with the GPL ``piper-tts``.
- Transport: an input that is fed the benchmark's file realtime-paced, and an output that plays like a sound card
  (each write returns when its audio has played) and notes when each reply's first audible sample plays.

Imports pipecat, numpy and soundfile, and from s2s only ``s2s.tts.piper`` and ``s2s.audio`` (numpy, onnxruntime,
omegaconf for the package's own import; the espeak-ng program). Protocol: one JSON object per line on stdin
(``{"input": wav, "speech_end_s": s, "trailing_s": s, "reply_timeout_s": s}``), one ``RESULT {...}`` line per file
on stdout; ``READY {...}`` once the models are loaded. Logs go to stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from importlib import metadata
from typing import Any

import numpy as np
import soundfile
from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.frames.frames import (Frame, InputAudioRawFrame, LLMTextFrame, OutputAudioRawFrame, StartFrame,
                                   TranscriptionFrame)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService
from pipecat.services.whisper.stt import WhisperSTTService
from pipecat.transcriptions.language import Language
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.turns.user_stop import SpeechTimeoutUserTurnStopStrategy, TurnAnalyzerUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.workers.runner import WorkerRunner

from s2s import audio
from s2s.messages import ReplyAudio, ReplyText
from s2s.tts.piper import PiperTTS

RATE = 16000
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class FedInput(BaseInputTransport):
    """An input transport whose audio the benchmark pushes (``push_audio_frame``), as a microphone's would be."""

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)


class Playback(BaseOutputTransport):
    """An output that plays like a sound card: a write returns once its audio has played. ``onsets`` are the
    times (``time.monotonic()``) at which each reply's first audible sample (``audio.SILENCE_LEVEL``, as our
    metrics use) plays; a sound after 0.5 s without any starts another."""

    def __init__(self, params: TransportParams) -> None:
        super().__init__(params)
        self.onsets: list[float] = []
        self.heard = asyncio.Event()
        self._last_sound: float | None = None
        self._played_until = 0.0

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        now = time.monotonic()
        samples = audio.int16_to_float(np.frombuffer(frame.audio, dtype=np.int16))
        begins = max(now, self._played_until)
        if (bounds := audio.sound_bounds(samples)) is not None:
            first, end = (begins + index / frame.sample_rate for index in bounds)
            if self._last_sound is None or first - self._last_sound > 0.5:
                self.onsets.append(first)
                self.heard.set()
            self._last_sound = end
        self._played_until = begins + len(samples) / frame.sample_rate
        await asyncio.sleep(max(0.0, self._played_until - time.monotonic()))
        return True


class Tap(FrameProcessor):
    """Passes every frame on; keeps the text of the frames of ``kind`` (the transcript, the reply)."""

    def __init__(self, kind: type[Frame]) -> None:
        super().__init__()
        self.kind = kind
        self.texts: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, self.kind):
            self.texts.append(frame.text)
        await self.push_frame(frame, direction)


class OurPiperTTS(TTSService):
    """A pipecat TTS service that says each text with our set-up ``PiperTTS`` stage, in a worker thread, as
    pipecat's ``PiperTTSService`` runs ``piper-tts``."""

    def __init__(self, stage: PiperTTS, **kwargs: Any) -> None:
        super().__init__(push_start_frame=True, push_stop_frames=True, sample_rate=stage.sample_rate,
                         settings=TTSSettings(model=None, voice=None, language=None), **kwargs)
        self._stage = stage

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str):  # -> AsyncGenerator[Frame, None]
        blocks = self._stage.process(ReplyText(text, 0))

        def pull() -> bytes | None:
            for message in blocks:
                if isinstance(message, ReplyAudio):
                    return audio.float_to_int16(message.samples).tobytes()
            return None

        async def pcm():
            while (block := await asyncio.to_thread(pull)) is not None:
                yield block

        try:
            await self.start_tts_usage_metrics(text)
            async for frame in self._stream_audio_frames_from_iterator(pcm(), in_sample_rate=self._stage.sample_rate,
                                                                       context_id=context_id):
                await self.stop_ttfb_metrics()
                yield frame
        finally:
            blocks.close()
            await self.stop_ttfb_metrics()


class Agent:
    """The models that last across files (the Piper voice) and the settings of every file's pipeline."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.voice = PiperTTS(**{**json.loads(args.piper), "model": args.voice})
        self.voice.setup()
        self.voice.warm_up()

    def stop_strategies(self) -> UserTurnStrategies:
        if self.args.turn == "speech_timeout":
            return UserTurnStrategies(stop=[SpeechTimeoutUserTurnStopStrategy()])
        analyzer = LocalSmartTurnAnalyzerV3()  # pipecat's default stop strategy, made here to warm it up
        analyzer._predict_endpoint(np.zeros(RATE, dtype=np.float32))  # its first ONNX call, as our warm_up does
        return UserTurnStrategies(stop=[TurnAnalyzerUserTurnStopStrategy(turn_analyzer=analyzer)])

    def stt(self) -> WhisperSTTService:
        service = WhisperSTTService(device="cpu", compute_type=self.args.whisper_compute_type,
                                    settings=WhisperSTTService.Settings(model=self.args.whisper, language=Language.EN))
        # one throwaway second of silence, as our STT's warm_up: the first call pays one-off costs
        segments, _ = service._model.transcribe(np.zeros(RATE, dtype=np.float32), language="en")
        list(segments)
        return service

    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """One file through a fresh pipeline (a new conversation), realtime-paced; the reply onsets on the input
        clock (0 = the first input sample; a chunk counts as heard at its end, as our runner maps it)."""
        samples, rate = soundfile.read(request["input"], dtype="int16")
        assert rate == RATE and samples.ndim == 1, "the benchmark writes 16 kHz mono"
        samples = np.concatenate([samples, np.zeros(round(request["trailing_s"] * RATE), dtype=np.int16)])
        source = FedInput(TransportParams(audio_in_enabled=True, audio_in_sample_rate=RATE))
        sink = Playback(TransportParams(audio_out_enabled=True, audio_out_sample_rate=self.voice.sample_rate))
        heard, said = Tap(TranscriptionFrame), Tap(LLMTextFrame)
        llm = OpenAILLMService(api_key="local", base_url=self.args.llm_url,
                               settings=OpenAILLMService.Settings(model="s2s-local",
                                                                  system_instruction=self.args.system_prompt))
        context = LLMContext()
        pair = LLMContextAggregatorPair(context, user_params=LLMUserAggregatorParams(
            vad_analyzer=SileroVADAnalyzer(params=VADParams()), user_turn_strategies=self.stop_strategies()))
        pipeline = Pipeline([source, self.stt(), heard, pair.user(), llm, said, OurPiperTTS(self.voice), sink,
                             pair.assistant()])
        worker = PipelineWorker(pipeline, params=PipelineParams(audio_in_sample_rate=RATE,
                                                                audio_out_sample_rate=self.voice.sample_rate),
                                cancel_on_idle_timeout=False, idle_timeout_secs=None, enable_rtvi=False)
        started = asyncio.Event()

        @worker.event_handler("on_pipeline_started")
        async def _started(worker: Any, frame: Frame) -> None:
            started.set()

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.create_task(runner.run())
        step = int(self.args.chunk_ms * RATE / 1000)
        chunk_s = step / RATE
        try:
            await asyncio.wait_for(started.wait(), START_TIMEOUT_S)
            start = time.monotonic()
            for index, offset in enumerate(range(0, len(samples), step)):
                await asyncio.sleep(max(0.0, start + index * chunk_s - time.monotonic()))
                block = samples[offset:offset + step]
                block = np.pad(block, (0, step - len(block)))
                await source.push_audio_frame(InputAudioRawFrame(audio=block.tobytes(), sample_rate=RATE,
                                                                 num_channels=1))
            # a reply heard after the end of speech ends the file; else wait for one, at most reply_timeout_s
            end_wall = start + request["speech_end_s"] - chunk_s
            deadline = time.monotonic() + request["reply_timeout_s"]
            while not any(at >= end_wall for at in sink.onsets) and time.monotonic() < deadline:
                sink.heard.clear()
                try:
                    await asyncio.wait_for(sink.heard.wait(), deadline - time.monotonic())
                except TimeoutError:
                    break
        finally:
            await worker.cancel()
            try:
                await asyncio.wait_for(running, STOP_TIMEOUT_S)
            except TimeoutError:
                running.cancel()
        return {"onsets_s": [round(at - start + chunk_s, 4) for at in sink.onsets],
                "transcript": " / ".join(text.strip() for text in heard.texts), "turns": len(heard.texts),
                "reply": "".join(said.texts).strip()}


def versions() -> dict[str, str]:
    found = {}
    for name in ("pipecat-ai", "faster-whisper", "ctranslate2", "onnxruntime", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


async def serve(args: argparse.Namespace) -> None:
    agent = Agent(args)
    print("READY " + json.dumps({"versions": versions(), "python": sys.version.split()[0]}), flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        request = json.loads(line)
        try:
            result = await agent.run(request)
        except Exception as error:  # reported per file; the benchmark decides
            result = {"error": f"{type(error).__name__}: {error}"}
        print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whisper", required=True, help="the faster-whisper model folder")
    parser.add_argument("--whisper-compute-type", default="int8")
    parser.add_argument("--voice", required=True, help="the Piper voice .onnx (its .onnx.json beside it)")
    parser.add_argument("--piper", default="{}", help="PiperTTS keywords as JSON (speed, noise_scale, ...)")
    parser.add_argument("--llm-url", required=True, help="the chat-completions endpoint's root, .../v1")
    parser.add_argument("--system-prompt", required=True)
    parser.add_argument("--chunk-ms", type=int, default=32)
    parser.add_argument("--turn", choices=("smart_turn", "speech_timeout"), default="smart_turn")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
