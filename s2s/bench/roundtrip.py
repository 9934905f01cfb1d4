"""Round-trip sink: transcribes each turn's reply audio with Whisper and reports its word error rate."""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from s2s.config_errors import ValidationContext
from s2s.messages import Data, Message, Metric, ReplyAudio, SpeechSegment, Transcript
from s2s.stage import Stage, require
from s2s.stt.faster_whisper import FasterWhisperSTT

log = logging.getLogger(__name__)


def _normaliser(jiwer: Any) -> Any:
    # hyphens and slashes separate words ("well-known" is heard as "well known"); other punctuation goes
    return jiwer.Compose([jiwer.ToLowerCase(), jiwer.SubstituteRegexes({r"[-\u2013\u2014/]": " "}),
                          jiwer.RemovePunctuation(), jiwer.RemoveMultipleSpaces(), jiwer.Strip(),
                          jiwer.ReduceToListOfListOfWords()])


def word_error_rate(reference: str, hypothesis: str) -> float:
    """WER of ``hypothesis`` against ``reference`` (jiwer), ignoring case and punctuation."""
    jiwer = require("jiwer", backend="sink=roundtrip", extra="sweep")
    normalise = _normaliser(jiwer)
    return float(jiwer.wer(reference, hypothesis, reference_transform=normalise, hypothesis_transform=normalise))


def whisper_normalised_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word errors, reference words) after Whisper's English text normaliser, the one published Whisper WERs use
    (transformers' ``EnglishTextNormalizer``, without its British-to-American spelling table): numbers as digits
    ("ten" and "10"), contractions and "gonna" spelled out, fillers and punctuation dropped. What it forgives does
    not change what was said: "Go forward 10 meters." for "Go forward ten meters." is no error."""
    jiwer = require("jiwer", backend="sink=roundtrip", extra="sweep")
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    normalise = EnglishTextNormalizer({})
    said, heard = normalise(reference).split(), normalise(hypothesis).split()
    if not said:
        return len(heard), 0
    found = jiwer.process_words(" ".join(said), " ".join(heard))
    return found.substitutions + found.deletions + found.insertions, len(said)


class RoundTripSink(Stage):
    """Collects each turn's reply audio; at the end of input transcribes it and yields ``Metric(turn, "wer")``.

    Transcription waits for the end of input so Whisper never competes with the TTS being timed. The
    recognizer is the project's faster-whisper stage (packaged tiny.en by default), used as a library.
    Without references (e.g. behind an LLM) it only records what Whisper heard in each reply.

    Args:
        references: the text each turn was meant to say (turn i -> references[i]), e.g. the sentence
            source's; null: no WER, transcripts only.
        model: Whisper model for the transcription (see ``stt=faster_whisper``).
        device: where Whisper runs (mps falls back to the CPU).
        language: language of the speech, or null to detect it (multilingual models only).
        save_dir: where ``roundtrip.jsonl`` (reference, heard, wer) and ``turn_<i>.wav`` go; null: nowhere.
    """

    accepts = (ReplyAudio,)

    def __init__(self, references: list[str] | None, model: str = "tiny.en", device: str = "cpu",
                 language: str | None = "en", save_dir: str | None = None) -> None:
        self.references = list(references or [])
        self.save_dir = Path(save_dir).expanduser() if save_dir else None
        self._stt = FasterWhisperSTT(model=model, device=device, language=language)
        self._audio: dict[int, list[np.ndarray]] = {}
        self._rates: dict[int, int] = {}

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        references = kwargs["references"]
        if references is not None and (not references or not all(isinstance(text, str) and text.strip()
                                                                  for text in references)):
            raise context.error("references", references, "null or a non-empty list of non-empty strings")

    def setup(self) -> None:
        require("jiwer", backend="sink=roundtrip", extra="sweep")
        self._stt.setup()
        if self.save_dir:
            self.save_dir.mkdir(parents=True, exist_ok=True)

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, ReplyAudio)
        self._audio.setdefault(message.turn, []).append(message.samples)
        self._rates[message.turn] = message.sample_rate
        return iter(())

    def flush(self) -> Iterator[Message]:
        if not self.references:
            log.info("no reference texts (source=sentences provides them): transcribing only, no WER")
        records = []
        for turn in sorted(set(range(len(self.references))) | set(self._audio)):
            blocks = self._audio.pop(turn, [])
            samples = np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
            rate = self._rates.get(turn, 16000)
            heard = self._transcribe(samples, rate, turn)
            record = {"turn": turn, "reference": None, "heard": heard, "wer": None,
                      "audio_s": round(len(samples) / rate, 3)}
            if turn < len(self.references):
                record["reference"] = self.references[turn]
                record["wer"] = round(word_error_rate(self.references[turn], heard), 4)
                yield Metric(turn, "wer", record["wer"], {"reference": record["reference"], "heard": heard})
            log.info("turn %d: WER %s | said %r, heard %r", turn, record["wer"], record["reference"], heard)
            records.append(record)
            self._save(turn, samples, rate)
        if self.save_dir:
            with (self.save_dir / "roundtrip.jsonl").open("w", encoding="utf-8") as file:
                file.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)

    def _transcribe(self, samples: np.ndarray, rate: int, turn: int) -> str:
        if not len(samples):
            return ""
        segment = SpeechSegment(samples, rate, turn, 0.0, len(samples) / rate)
        texts = [output.text for output in self._stt.process(segment) if isinstance(output, Transcript)]
        return " ".join(texts)

    def _save(self, turn: int, samples: np.ndarray, rate: int) -> None:
        if self.save_dir and len(samples):
            import soundfile

            soundfile.write(str(self.save_dir / f"turn_{turn}.wav"), samples, rate, subtype="PCM_16")

    def reset(self) -> None:
        self._audio.clear()
        self._rates.clear()

    def close(self) -> None:
        self._stt.close()

    def describe(self) -> dict[str, Any]:
        return {"judge": self._stt.describe()["model"], "references": len(self.references)}
