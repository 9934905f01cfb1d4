"""Moonshine base English (Useful Sensors, MIT), packaged in ``moonshine-cpp``, on onnxruntime.

Moonshine's encoder takes the raw audio and costs in proportion to it (no 30 s or 10 s window to fill), and on
the project's real-speech set it heard more than Whisper tiny.en in less time (README, Recognition). The
package's own runtime is not used: its model files are converted once into the cache
(:mod:`s2s.stt.moonshine_convert`) and decoded here, greedily, with the decoder's cache.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np

from s2s.config_errors import Range, ValidationContext
from s2s.models import build_once, cache_root, fingerprint, local_path, model_source, package_file
from s2s.onnx import cpu_session
from s2s.stage import require
from s2s.stt import moonshine_convert
from s2s.stt.base import STTStage, repeats_itself

log = logging.getLogger(__name__)
RATE = 16000
PACKAGE = "moonshine_cpp"  # moonshine-cpp 0.1.4 (MIT): models/base-en/ (ORT files, tokenizer.bin)
PACKAGED = {"base.en": ("models", "base-en")}
START, END = 1, 2  # the tokenizer's <s> and </s>
SPACE = "\u2581"  # a token's leading space
TOKENS_PER_S, TOKENS_MORE = 8, 8  # a bound on a decode: speech holds fewer tokens a second (Moonshine's own: 6.5)
LONGEST_S = 30.0  # longer speech is decoded in pieces of at most this length (Moonshine was trained on up to 64 s)
CUT_WITHIN_S = 5.0  # ... cut at the quietest moment of their last this many seconds
# silence put before and after the speech: without it Moonshine heard espeak's "Good morning to you." as nothing
# in 9 of 12 voices and rates (README, Moonshine base)
LEAD_S, TAIL_S = 0.5, 0.5


def read_tokens(path: Path) -> list[bytes]:
    """moonshine-cpp's ``tokenizer.bin``: each token's bytes after their length (one byte; with the high bit
    set, a second byte holds the length's next seven bits). ``▁`` stands for a space."""
    data = path.read_bytes()
    tokens, at = [], 0
    while at < len(data):
        length = data[at]
        at += 1
        if length >= 0x80:
            length = (length & 0x7F) | (data[at] << 7)
            at += 1
        tokens.append(data[at:at + length])
        at += length
    return tokens


def source_folder(model: str) -> Path | None:
    """The Moonshine folder ``model`` names: packaged (None when moonshine-cpp is not installed), else local."""
    if model_source(model, PACKAGED) == "packaged":
        return package_file(PACKAGE, *PACKAGED[model])
    return local_path(model)


def pieces(samples: np.ndarray) -> list[np.ndarray]:
    """``samples`` in pieces of at most ``LONGEST_S``, each cut at the quietest tenth of a second of its last
    ``CUT_WITHIN_S`` (a pause between words, where there is one)."""
    longest, frame = int(LONGEST_S * RATE), RATE // 10
    found = []
    while len(samples) > longest:
        tail = samples[longest - int(CUT_WITHIN_S * RATE):longest]
        energy = np.convolve(tail ** 2, np.ones(frame), "valid")[::frame // 4]
        cut = longest - len(tail) + int(np.argmin(energy)) * (frame // 4) + frame // 2
        found.append(samples[:cut])
        samples = samples[cut:]
    return [*found, samples]


def _convert(folder: Path, out: Path) -> None:
    """The conversion, which alone needs onnx (a start with the converted copy cached imports none of it)."""
    require("onnx", backend="stt=moonshine", extra=None)
    moonshine_convert.convert(folder, out)


class MoonshineSTT(STTStage):
    """Transcribes each utterance with Moonshine (English).

    Args:
        model: ``base.en`` (packaged in moonshine-cpp, offline) or a local folder in moonshine-cpp's layout
            (``encoder_model.ort``/``.onnx``, ``decoder_model_merged.ort``/``.onnx``, ``tokenizer.bin``).
        language: ``en``: Moonshine base is English only.
        incremental_s: decode the utterance while the user speaks, after each this many seconds of new speech,
            the decoder made to start with the words three passes agreed on (:mod:`s2s.stt.incremental`); null:
            one pass when the utterance ends.
        at_pause: decode the utterance when the speech pauses, as ``stt=faster_whisper`` (see there).
        cache_dir: where the converted model is written once (null: the user cache folder).
    """

    sample_rate = RATE

    def __init__(self, model: str = "base.en", language: Literal["en"] = "en",
                 incremental_s: Annotated[float, Range(0.2, 5)] | None = None, at_pause: bool = False,
                 cache_dir: str | None = None) -> None:
        self.model_name = model
        self.language = language
        self.incremental_s = incremental_s
        self.at_pause = at_pause
        self.cache_dir = cache_dir
        self._sessions: tuple[Any, Any, Any] | None = None
        self._tokens: list[bytes] = []
        self._last: list[int] = []  # the last decode's tokens: a later pass's committed words are read from them

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        model = kwargs["model"]
        if model_source(model, PACKAGED) == "hub":
            raise context.error("model", model, f"one of {', '.join(PACKAGED)} (packaged in moonshine-cpp) or a "
                                "local folder of Moonshine's files (moonshine-cpp's layout)")
        folder = source_folder(model)
        if model_source(model, PACKAGED) != "local" or folder is None:
            return
        if not folder.is_dir():
            raise context.error("model", model, f"one of {', '.join(PACKAGED)} or an existing folder of Moonshine's "
                                "files (no such folder)")
        if lacks := moonshine_convert.missing(folder):
            raise context.error("model", model, f"a folder with Moonshine's files (it lacks {', '.join(lacks)})")

    def setup(self) -> None:
        onnxruntime = require("onnxruntime", backend="stt=moonshine", extra=None)
        folder = source_folder(self.model_name)
        if folder is None or not folder.is_dir():
            require(PACKAGE, backend="stt=moonshine", extra="moonshine")  # not installed: the error names the extra
            raise FileNotFoundError(f"stt.model={self.model_name}: no Moonshine files in {folder}")
        built = build_once(cache_root(self.cache_dir) / self._converted_name(folder),
                           lambda out: _convert(folder, out),
                           f"Moonshine {self.model_name} (converted for onnxruntime)")
        threads = self.threads or 1  # a small model's products are too small to share among threads
        self._sessions = tuple(cpu_session(onnxruntime, built / name, threads)  # type: ignore[assignment]
                               for name in moonshine_convert.OUTPUTS[:3])
        self._tokens = read_tokens(built / moonshine_convert.TOKENIZER)

    def _converted_name(self, folder: Path) -> str:
        """The converted copy's folder in the cache: the packaged model's name, or (a local folder) a digest of its
        path and its files' sizes and times, so an edited folder is converted again; and the conversion's version."""
        name = fingerprint(folder) if model_source(self.model_name, PACKAGED) == "local" else self.model_name
        return f"moonshine-{name}-int8-v{moonshine_convert.VERSION}"

    def transcribe(self, samples: Any) -> tuple[str, str]:
        texts = []
        for piece in pieces(np.asarray(samples, dtype=np.float32)):
            tokens, ended = self._generate(piece, [])
            text = self._text(tokens).strip()
            texts.append("" if not ended and repeats_itself(text) else text)
        return " ".join(text for text in texts if text), "en"

    def transcribe_from(self, samples: Any, prefix: str) -> tuple[str | None, str]:
        """What follows ``prefix`` (committed words of earlier passes) in ``samples``: the decoder reads the tokens
        an earlier pass wrote them with in one call, then makes only the rest. None: a prefix no earlier pass wrote
        as such, speech longer than one piece, or a decode that loops (the turn then decodes it whole)."""
        samples = np.asarray(samples, dtype=np.float32)
        forced = self._written(prefix)
        if forced is None or len(samples) > LONGEST_S * RATE:
            return None, "en"
        tokens, ended = self._generate(samples, forced)
        rest = self._text(tokens).rstrip()
        return (None if not ended and repeats_itself(rest) else rest), "en"

    def _written(self, prefix: str) -> list[int] | None:
        """The tokens of the last decode that wrote exactly ``prefix`` (whole words), or None."""
        if not prefix:
            return []
        text = ""
        for count, token in enumerate(self._last, 1):
            text += self._text([token])
            following = self._tokens[self._last[count]] if count < len(self._last) else SPACE.encode()
            if " ".join(text.split()) == prefix and following.startswith(SPACE.encode()):  # a word ends here
                return self._last[:count]
        return None

    def _text(self, tokens: list[int]) -> str:
        """The tokens' text, spaces as they come (a leading one included), runs of them as one."""
        text = b"".join(self._tokens[token] for token in tokens).decode("utf-8", "replace").replace(SPACE, " ")
        return re.sub(r"\s+", " ", text)

    def _generate(self, samples: np.ndarray, forced: list[int]) -> tuple[list[int], bool]:
        """The tokens after ``forced`` for one piece of speech, and whether the decoder ended them (``</s>``): the
        encoder once, the first decoder call over ``<s>`` and ``forced``, then greedy steps from the cache, at most
        ``TOKENS_PER_S`` a second of speech (plus ``TOKENS_MORE``) in all."""
        assert self._sessions is not None, "setup() first"
        encoder, first, step = self._sessions
        seconds = len(samples) / RATE
        samples = np.pad(samples, (int(LEAD_S * RATE), int(TAIL_S * RATE)))
        hidden = encoder.run(None, {"input_values": samples[None]})[0]
        outputs = first.run(None, {"input_ids": np.array([[START, *forced]], np.int64), "encoder_hidden_states": hidden})
        names = [output.name for output in first.get_outputs()]
        cache = {name.replace("present", "past_key_values"): value for name, value in zip(names[1:], outputs[1:])}
        step_names = [output.name for output in step.get_outputs()]
        tokens: list[int] = []
        longest = TOKENS_MORE + int(TOKENS_PER_S * seconds) - len(forced)
        token = int(outputs[0][0, -1].argmax())
        while token != END and len(tokens) < longest:
            tokens.append(token)
            outputs = step.run(None, {"input_ids": np.array([[token]], np.int64), **cache})
            for name, value in zip(step_names[1:], outputs[1:]):
                if ".decoder." in name:  # the encoder's keys and values stay those of the first call
                    cache[name.replace("present", "past_key_values")] = value
            token = int(outputs[0][0, -1].argmax())
        self._last = forced + tokens
        if token != END:
            log.info("Moonshine stopped at its bound on %.1f s of speech (%d tokens)", seconds, len(self._last))
        return tokens, token == END

    def reset(self) -> None:
        super().reset()
        self._last = []

    def close(self) -> None:
        self._sessions = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": "cpu (onnxruntime)", "language": "en"}
