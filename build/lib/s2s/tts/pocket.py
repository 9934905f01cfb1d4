"""Kyutai Pocket TTS (pocket-tts): a ~100M-parameter streaming TTS built for CPUs, with voice cloning.

``generate_audio_stream`` runs the model in a generation thread and a Mimi decoder thread and yields audio as
frames are decoded; its ``stop`` event is the only way to end those threads early, so closing our generator
sets it.
"""
from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from s2s.config_errors import ConfigError, ConfigErrors, Range, ValidationContext
from s2s.stage import require
from s2s.torch_support import usable_device
from s2s.tts.base import TTSStage

# pocket-tts's predefined voices (pocket_tts.utils.utils._ORIGINS_OF_PREDEFINED_VOICES, 4.0): states computed
# with the released weights of each packaged language config, downloaded on first use.
PRESET_VOICES = ("alba", "marius", "javert", "jean", "fantine", "cosette", "eponine", "azelma", "anna", "vera",
                 "charles", "paul", "george", "mary", "jane", "michael", "eve", "bill_boerst", "peter_yearsley",
                 "stuart_bell", "caro_davy", "giovanni", "lola", "juergen", "rafael", "daan", "estelle")
MAX_TOKENS_PER_CHUNK = 50  # pocket_tts.default_parameters.MAX_TOKEN_PER_CHUNK


def packaged_languages() -> list[str] | None:
    """Names of the configs shipped in pocket_tts/config (english, french, ...), found without importing it."""
    spec = importlib.util.find_spec("pocket_tts")
    if spec is None or not spec.submodule_search_locations:
        return None
    return sorted(path.stem for location in spec.submodule_search_locations
                  for path in (Path(location) / "config").glob("*.yaml"))


class PocketTTS(TTSStage):
    """Pocket TTS: incremental streaming at 24 kHz, preset voices or cloning from a short reference recording.

    Args:
        voice: a preset name (alba, marius, javert, jean, fantine, cosette, eponine, azelma, ...) or a reference
            audio file to clone (wav/mp3/flac), or a ``.safetensors`` voice state exported by pocket-tts.
        language: the packaged model to load (english, french, german, italian, portuguese, spanish, dutch, and
            their variants); ignored when ``model`` is set.
        max_tokens: text tokens per generated chunk; longer replies are split at sentence ends.
        model: a pocket-tts YAML config (local file, ``hf://`` or ``https://``) for other weights; null: the
            packaged config of ``language``.
        device: torch device; the model is small and batch-1, so the CPU is usually as fast as a GPU.
    """

    voice_key = "voice"

    sample_rate = 24000

    def __init__(self, voice: str = "alba", language: str = "english",
                 max_tokens: Annotated[int, Range(1, 10000)] = MAX_TOKENS_PER_CHUNK,
                 model: str | None = None, device: str = "cpu") -> None:
        self.voice = voice
        self.language = language
        self.max_tokens = max_tokens
        self.model = model
        self.device = device
        self._model: Any = None
        self._voice_state: Any = None

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        voice, model = kwargs["voice"], kwargs["model"]
        errors: list[ConfigError] = []
        if voice in PRESET_VOICES:
            if model is not None:
                errors.append(context.error("voice", voice, "a reference audio file: preset voices are states of "
                                                            "the packaged weights, so they need model: null"))
        elif not Path(voice).expanduser().is_file():
            errors.append(context.error("voice", voice, f"a preset voice ({', '.join(PRESET_VOICES)}) or an existing "
                                                        f"reference audio file to clone"))
        languages = packaged_languages()
        if model is None and languages is not None and kwargs["language"] not in languages:
            errors.append(context.error("language", kwargs["language"], languages))
        if model is not None and not model.startswith(("hf://", "http://", "https://")):
            if not model.endswith((".yaml", ".yml")) or not Path(model).expanduser().is_file():
                errors.append(context.error("model", model, "null, an hf:// or https:// config, or an existing "
                                                            "pocket-tts YAML config file"))
        if errors:
            raise ConfigErrors(errors)

    def setup(self) -> None:
        torch = require("torch", backend="tts=pocket", extra="pocket")
        threads = torch.get_num_threads()
        pocket_tts = require("pocket_tts", backend="tts=pocket", extra="pocket")
        # Importing pocket_tts sets torch to one thread for the whole process; the other stages need theirs.
        torch.set_num_threads(threads)
        pocket_log = logging.getLogger("pocket_tts")
        if pocket_log.level == logging.NOTSET:  # it logs several timing lines per sentence at INFO
            pocket_log.setLevel(logging.WARNING)
        self.device = usable_device(self.device)
        if self.model is None:
            model = pocket_tts.TTSModel.load_model(language=self.language)
        else:
            local = Path(self.model).expanduser()
            model = pocket_tts.TTSModel.load_model(config=local if local.is_file() else self.model)
        self._model = model.to(self.device)
        self.sample_rate = int(model.sample_rate)
        voice = self.voice if self.voice in PRESET_VOICES else Path(self.voice).expanduser()
        self._voice_state = model.get_state_for_audio_prompt(voice)

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        stop = threading.Event()
        chunks = self._model.generate_audio_stream(self._voice_state, text, max_tokens=self.max_tokens, stop=stop)
        try:
            yield from chunks
        finally:
            stop.set()  # ends pocket-tts's generation thread, which closing the stream alone would leave running
            chunks.close()

    def close(self) -> None:
        self._model = None
        self._voice_state = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model or f"packaged {self.language}", "voice": self.voice,
                "max_tokens": self.max_tokens, "device": self.device}
