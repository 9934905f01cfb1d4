"""Kokoro-82M through the ``kokoro`` package (torch), or through mlx-audio (Metal on Apple silicon, CPU on Linux).

Both libraries stream one audio block per text segment (a line, or ~510 phonemes of English) and take the
same voices; mlx-audio stores them as ``.safetensors`` where kokoro stores ``.pt``. Each turn speaks the
language the STT detected: one G2P pipeline per Kokoro ``lang_code``, all sharing one model.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from s2s import torch_support
from s2s.config_errors import ConfigError, ConfigErrors, Range, ValidationContext
from s2s.models import local_path, model_folder_error
from s2s.runtimes import ByBackend, Runtime
from s2s.stage import require
from s2s.tts.base import TTSStage
from s2s.tts.g2p import packaged_spacy_model

log = logging.getLogger(__name__)

DEFAULT_MODEL = "hexgrad/Kokoro-82M"
# Hub ids the torch KModel knows, with their weight file (kokoro.KModel.MODEL_NAMES).
TORCH_MODELS = {"hexgrad/Kokoro-82M": "kokoro-v1_0.pth", "hexgrad/Kokoro-82M-v1.1-zh": "kokoro-v1_1-zh.pth"}
# The same weights converted for mlx-audio; other ids (mlx-community/Kokoro-82M-4bit, ...) pass through.
MLX_MODELS = {"hexgrad/Kokoro-82M": "mlx-community/Kokoro-82M-bf16"}
# Detected language (ISO 639-1, as Whisper reports it) -> Kokoro lang_code and that language's default voice.
LANGUAGES = {"en": ("a", "af_heart"), "es": ("e", "ef_dora"), "fr": ("f", "ff_siwis"), "hi": ("h", "hf_alpha"),
             "it": ("i", "if_sara"), "ja": ("j", "jf_alpha"), "pt": ("p", "pf_dora"), "zh": ("z", "zf_xiaobei")}
ENGLISH = ("a", "b")  # American and British English are both "en" to the STT
G2P_EXTRAS = {"j": "misaki[ja]", "z": "misaki[zh]"}  # languages whose G2P needs more than kokoro installs
VOICE_SUFFIX = {"torch": ".pt", "mlx": ".safetensors"}

LangCode = Literal["a", "b", "e", "f", "h", "i", "j", "p", "z"]


def mlx_conversion(model: str) -> str:
    """``hexgrad/Kokoro-82M`` -> its mlx-community conversion; local folders and other ids pass through."""
    return model if local_path(model) else MLX_MODELS.get(model, model)


def is_voice_file(voice: str) -> bool:
    return voice.endswith((".pt", ".safetensors")) or "/" in voice or "\\" in voice


def torch_weights(folder: Path) -> Path:
    """The one ``.pth`` file of a local kokoro folder (the hub's file name wins when there are several)."""
    weights = sorted(folder.glob("*.pth"))
    known = [path for path in weights if path.name in TORCH_MODELS.values()]
    if len(weights) == 1 or len(known) == 1:
        return (known or weights)[0]
    raise FileNotFoundError(f"tts=kokoro: {folder} needs config.json and one .pth weights file "
                            f"(found {[path.name for path in weights] or 'none'})")


class KokoroTTS(TTSStage):
    """Kokoro-82M, multilingual, 24 kHz; one streamed block per text segment.

    Args:
        voice: a voice name (af_heart, bm_fable, ff_siwis...; comma-separated names are blended) or a local voice
            file (``.pt`` for torch, ``.safetensors`` for mlx). It is used for ``lang_code``; a turn detected in
            another language speaks with that language's default voice.
        lang_code: Kokoro's language: a (American English), b (British), e (es), f (fr), h (hi), i (it),
            j (ja, needs misaki[ja]), p (pt-br), z (zh, needs misaki[zh]).
        speed: speaking rate (1.0 = normal).
        model: a hub id, or a local folder with config.json and weights (a ``.pth`` for torch; an mlx-audio
            conversion with ``.safetensors`` for mlx) and optionally ``voices/``.
        backend: torch (the kokoro package) or mlx (mlx-audio; hub ids map to mlx-community conversions).
        device: torch device; with mlx, ``mps`` means Metal and anything else the CPU.
    """

    voice_key = "voice"
    speed_key = "speed"
    runtime_keys = frozenset({"voice", "speed"})  # both are read per call; the pipeline loads a voice once

    sample_rate = 24000
    requires = ByBackend({"torch": None, "mlx": Runtime("mlx")})

    def __init__(self, voice: str = "af_heart", lang_code: LangCode = "a",
                 speed: Annotated[float, Range(0.25, 4)] = 1.0, model: str = DEFAULT_MODEL,
                 backend: Literal["torch", "mlx"] = "torch", device: str = "cpu") -> None:
        self.voice = voice
        self.lang_code = lang_code
        self.speed = speed
        self.model = model
        self.backend = backend
        self.device = device
        self._model: Any = None
        self._pipelines: dict[str, Any] = {}
        self._repo_id = model
        self._warned: set[str] = set()

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        backend, voice, model = kwargs["backend"], kwargs["voice"], kwargs["model"]
        errors: list[ConfigError] = []
        if is_voice_file(voice):
            if not voice.endswith(VOICE_SUFFIX[backend]):
                errors.append(context.error("voice", voice, f"a voice name or a {VOICE_SUFFIX[backend]} voice file "
                                                            f"(the format of backend={backend})"))
            elif not Path(voice).expanduser().is_file():
                errors.append(context.error("voice", voice, "an existing voice file (no such file)"))
        if local_path(model) is not None:
            weights = "*.pth" if backend == "torch" else "*.safetensors"  # the layout each backend loads
            if error := model_folder_error(model, context, DEFAULT_MODEL, needs=("config.json", weights)):
                errors.append(error)
        elif backend == "torch" and model not in TORCH_MODELS:
            errors.append(context.error("model", model, f"a local folder or one of {', '.join(TORCH_MODELS)}"))
        if errors:
            raise ConfigErrors(errors)

    def setup(self) -> None:
        torch_support.repair_torchaudio()  # misaki and kokoro import transformers/torch, which reach torchaudio
        if self.backend == "mlx":
            self._load_mlx()
        else:
            self._load_torch()
        self._pipeline(self.lang_code)  # the configured language must work; others load at their first turn

    def _load_torch(self) -> None:
        kokoro = require("kokoro", backend="tts=kokoro", extra="kokoro")
        self.device = torch_support.usable_device(self.device)
        folder = local_path(self.model)
        config = weights = None
        if folder is not None:
            config, weights = str(folder / "config.json"), str(torch_weights(folder))
            # The repo id only picks G2P variants (v1.1-zh) and where voice names download from.
            self._repo_id = next((repo for repo, name in TORCH_MODELS.items() if name == Path(weights).name),
                                 DEFAULT_MODEL)
        self._model = kokoro.KModel(repo_id=self._repo_id, config=config, model=weights).to(self.device).eval()

    def _load_mlx(self) -> None:
        mx = require("mlx.core", backend="tts=kokoro (backend mlx)", extra="mlx")
        utils = require("mlx_audio.tts.utils", backend="tts=kokoro (backend mlx)", extra="mlx")
        if self.device != "mps":
            mx.set_default_device(mx.cpu)
        model_id = mlx_conversion(self.model)
        self._model = utils.load_model(model_id)
        # Voice names resolve in the model's own voices/ folder first, then download from this repo.
        self._repo_id = MLX_MODELS[DEFAULT_MODEL] if local_path(self.model) else model_id

    def _pipeline(self, lang_code: str) -> Any:
        """The G2P + model pipeline of ``lang_code``, built once."""
        if lang_code not in self._pipelines:
            try:
                with packaged_spacy_model():  # English G2P would otherwise download spaCy's model
                    if self.backend == "mlx":
                        kokoro_mlx = require("mlx_audio.tts.models.kokoro", backend="tts=kokoro (backend mlx)",
                                             extra="mlx")
                        pipeline = kokoro_mlx.KokoroPipeline(lang_code=lang_code, model=self._model,
                                                             repo_id=self._repo_id,
                                                             model_path=self._model.config.model_path)
                    else:
                        kokoro = require("kokoro", backend="tts=kokoro", extra="kokoro")
                        pipeline = kokoro.KPipeline(lang_code=lang_code, repo_id=self._repo_id, model=self._model)
            except ImportError as error:
                extra = G2P_EXTRAS.get(lang_code, "misaki[en]")
                raise RuntimeError(f"tts=kokoro: lang_code={lang_code} needs its G2P: pip install '{extra}' "
                                   f"({type(error).__name__}: {error})") from error
            self._pipelines[lang_code] = pipeline
        return self._pipelines[lang_code]

    def _language_voice(self, language: str | None) -> tuple[str, str]:
        """(lang_code, voice) for a turn: the configured pair, or the detected language's default voice."""
        target = LANGUAGES.get((language or "").lower().split("-")[0])
        if target is None:
            if language and language not in self._warned:
                self._warned.add(language)
                log.warning("tts=kokoro has no voices for language %r; speaking it with lang_code=%s",
                            language, self.lang_code)
            return self.lang_code, self.voice
        if target[0] == self.lang_code or (target[0] in ENGLISH and self.lang_code in ENGLISH):
            return self.lang_code, self.voice
        return target

    def _voice_source(self, voice: str) -> str:
        """A torch voice name found in a local model's ``voices/`` folder becomes that file (no download)."""
        folder = local_path(self.model)
        if self.backend == "mlx" or folder is None:
            return voice
        parts = [str(folder / "voices" / f"{name}.pt") if not is_voice_file(name)
                 and (folder / "voices" / f"{name}.pt").is_file() else name for name in voice.split(",")]
        return ",".join(parts)

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        lang_code, voice = self._language_voice(language)
        try:
            pipeline = self._pipeline(lang_code)
        except RuntimeError as error:  # e.g. Japanese without misaki[ja]: keep talking in the configured language
            if lang_code not in self._warned:
                self._warned.add(lang_code)
                log.warning("%s; speaking with lang_code=%s instead", error, self.lang_code)
            lang_code, voice = self.lang_code, self.voice
            pipeline = self._pipeline(lang_code)
        results = pipeline(text, voice=self._voice_source(voice), speed=self.speed)
        try:
            for result in results:
                if result.audio is not None:
                    yield result.audio
        finally:
            results.close()

    def close(self) -> None:
        self._pipelines.clear()
        self._model = None

    def describe(self) -> dict[str, Any]:
        if self.backend == "mlx":
            device = "mlx default (Metal on Apple silicon)" if self.device == "mps" else "cpu (mlx)"
            return {"backend": "mlx", "model": mlx_conversion(self.model), "voice": self.voice,
                    "lang_code": self.lang_code, "speed": self.speed, "device": device}
        return {"backend": "torch", "model": self.model, "voice": self.voice, "lang_code": self.lang_code,
                "speed": self.speed, "device": self.device}
