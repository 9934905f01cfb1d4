"""ChatTTS (2noise/ChatTTS 0.2.5): conversational English/Chinese speech, streamed as the GPT generates codes."""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any

from s2s import torch_support
from s2s.config_errors import MUST_EXIST
from s2s.config_errors import ConfigError, ConfigErrors, Range, ValidationContext
from s2s.stage import require
from s2s.tts.base import TTSStage

log = logging.getLogger(__name__)
HUB_REPO = "2Noise/ChatTTS"
NORMALIZER_LANGUAGES = ("en", "zh")  # what ChatTTS's text normalizer knows; it is also all the model speaks


def chattts_config(base: Any, overrides: Mapping[str, Any], prefix: str = "config_overrides") -> Any:
    """A copy of ChatTTS's ``Config`` dataclass tree with ``overrides`` (nested mappings) applied.

    New objects are built with ``dataclasses.replace``: ChatTTS's dataclass defaults are shared instances,
    so mutating them would change every ``Chat`` in the process. Lists become tuples where ChatTTS has tuples.
    """
    fields = [field.name for field in dataclasses.fields(base)]
    changes = {}
    for key, value in overrides.items():
        if key not in fields:
            raise ConfigError(f"tts.{prefix}.{key}", value,
                              f"a field of ChatTTS's {type(base).__name__} config: {', '.join(fields)}")
        current = getattr(base, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, Mapping):
                raise ConfigError(f"tts.{prefix}.{key}", value, f"a mapping of {type(current).__name__} fields")
            changes[key] = chattts_config(current, value, f"{prefix}.{key}")
        else:
            changes[key] = tuple(value) if isinstance(current, tuple) else value
    return dataclasses.replace(base, **changes)


def local_sha256_map(folder: Path, shipped: Mapping[str, str]) -> dict[str, str]:
    """ChatTTS's asset hash map with the hashes of the files actually in ``folder``.

    ChatTTS keys a file ``asset/gpt/config.json`` as ``sha256_asset_gpt_config_json``; only keys it checks
    are replaced, so a missing file still fails ChatTTS's own check.
    """
    hashes = dict(shipped)
    for file in sorted((folder / "asset").rglob("*")):
        if not file.is_file():
            continue
        *dirs, name = file.relative_to(folder).parts
        key = "sha256_" + "_".join(dirs) + "_" + name.replace(".", "_")
        if key in hashes:
            hashes[key] = hashlib.sha256(file.read_bytes()).hexdigest()
    return hashes


class ChatTTSTTS(TTSStage):
    """ChatTTS through its own ``Chat.infer(stream=True)``: audio arrives every ``stream_batch`` codes.

    Args:
        model: a local folder holding ChatTTS's ``asset/`` tree, or null to download 2Noise/ChatTTS from the
            Hugging Face hub into the HF cache on first use (about 1 GB; needs network once).
        device: auto, cpu, cuda, cuda:N or mps (on mps ChatTTS itself keeps the GPT and Vocos on the CPU).
        speaker_seed: seeds torch's RNG around ``sample_random_speaker()`` so a seed always gives the same
            voice on a given device type; null draws a new random speaker every run.
        temperature: sampling temperature of the audio codes.
        top_p: nucleus sampling of the audio codes.
        top_k: top-k sampling of the audio codes.
        max_new_tokens: cap on audio codes per sentence (about 21 codes per second of speech).
        stream_batch: codes per streamed step; smaller gives earlier first audio and more, shorter blocks.
        refine_text: first let the GPT rewrite the text with pause/laugh tokens (the reference's behaviour;
            adds a non-streamed pass before the first audio).
        compile: torch.compile the GPT (ChatTTS does it only on CUDA).
        config_overrides: nested values applied to ChatTTS's ``Config`` before loading, for checkpoints with
            other sizes (e.g. ``{gpt: {num_hidden_layers: 10}}``); ChatTTS has no config file of its own.
        verify_hashes: false accepts a local folder whose files differ from the official release (a fine-tuned
            or self-converted checkpoint): their hashes are computed from the files instead of ChatTTS's list.
    """

    sample_rate = 24000

    def __init__(self, model: Annotated[str, MUST_EXIST] | None = None, device: str = "auto",
                 speaker_seed: Annotated[int, Range(0, 2**32 - 1)] | None = 42,
                 temperature: Annotated[float, Range(0.01, 5)] = 0.3, top_p: Annotated[float, Range(0.01, 1)] = 0.7,
                 top_k: Annotated[int, Range(1, 1000)] = 20,
                 max_new_tokens: Annotated[int, Range(1, 65536)] = 2048,
                 stream_batch: Annotated[int, Range(1, 1000)] = 24, refine_text: bool = False,
                 compile: bool = False, config_overrides: dict[str, Any] | None = None,
                 verify_hashes: bool = True) -> None:
        self.model = model
        self.device = device
        self.speaker_seed = speaker_seed
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.max_new_tokens = max_new_tokens
        self.stream_batch = stream_batch
        self.refine_text = refine_text
        self.compile = compile
        self.config_overrides = config_overrides or {}
        self.verify_hashes = verify_hashes
        self._chat: Any = None
        self.speaker: str | None = None  # the speaker embedding (ChatTTS's base16384 string) used for every turn
        self._warned_languages: set[str] = set()

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        errors = []
        if not kwargs["verify_hashes"] and kwargs["model"] is None:
            errors.append(context.error("verify_hashes", False, "true unless model is a local folder "
                                        "(hub downloads are not hash-checked)"))
        device = kwargs["device"]
        if kwargs["compile"] and not device.startswith("cuda"):
            errors.append(context.error("compile", True, f"false with device={device} "
                                        "(ChatTTS compiles the GPT only on CUDA)"))
        if errors:
            raise ConfigErrors(errors)

    def setup(self) -> None:
        self.device = torch_support.usable_device(self.device)
        torch_support.repair_torchaudio()  # ChatTTS imports torchaudio (a CUDA-only wheel beside a CPU torch)
        chattts = require("ChatTTS", backend="tts=chattts", extra="chattts")
        import torch

        chat = chattts.Chat()
        chat.config = chattts_config(chat.config, self.config_overrides)
        if self.model is None:
            log.info("ChatTTS: loading %s from the Hugging Face cache (downloads about 1 GB on first use)", HUB_REPO)
            source, path = "huggingface", None
        else:
            source, path = "custom", str(Path(self.model).expanduser())
            if not self.verify_hashes:
                chat.sha256_map = local_sha256_map(Path(path), chat.sha256_map)
        if not chat.load(source=source, custom_path=path, device=torch.device(self.device), compile=self.compile):
            hint = ("its files differ from the official release (set tts.verify_hashes=false for a fine-tuned or "
                    "converted checkpoint) or some are missing" if source == "custom" else
                    "the download failed (offline? set tts.model to a local folder holding asset/)")
            raise RuntimeError(f"ChatTTS could not load {path or HUB_REPO}: {hint}; see ChatTTS's log above")
        # The text normalizer is numba code compiled on first use (seconds; 20 s on a busy 2-core CPU): pay that
        # here rather than in the first reply. "?" takes the invalid-character path, compiling its helpers too.
        chat.normalizer("warm up?", do_text_normalization=True, do_homophone_replacement=True)
        self._chat = chat
        self.speaker = self._sample_speaker(torch)

    def _sample_speaker(self, torch: Any) -> str:
        if self.speaker_seed is None:
            return self._chat.sample_random_speaker()
        device = torch.device(self.device)
        # Fork so seeding for the voice leaves the caller's random streams (and code sampling) untouched.
        devices = [] if device.type == "cpu" else [device.index or 0]
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            torch.manual_seed(self.speaker_seed)
            return self._chat.sample_random_speaker()

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        text = text.strip()
        if not text:
            return
        if language and language not in NORMALIZER_LANGUAGES and language not in self._warned_languages:
            self._warned_languages.add(language)
            log.warning("ChatTTS speaks English and Chinese only; text in language %r is read as is", language)
        chat_class = type(self._chat)
        params = chat_class.InferCodeParams(
            spk_emb=self.speaker, temperature=self.temperature, top_P=self.top_p, top_K=self.top_k,
            max_new_token=self.max_new_tokens, stream_batch=self.stream_batch, show_tqdm=False)
        # split_text=False: the pipeline already sends sentences, and ChatTTS's own split would run a hidden
        # non-streamed pass to sample a voice prompt before the first audio.
        stream = self._chat.infer(
            text, stream=True, lang=language if language in NORMALIZER_LANGUAGES else None,
            skip_refine_text=not self.refine_text, split_text=False, params_infer_code=params,
            params_refine_text=chat_class.RefineTextParams(show_tqdm=False))
        try:
            for wavs in stream:  # (batch=1, samples) per streamed step
                yield wavs[0]
        finally:
            stream.close()  # stops the GPT's generation loop where it is suspended

    def close(self) -> None:
        self._chat = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model or f"{HUB_REPO} (hub download)", "speaker_seed": self.speaker_seed,
                "stream_batch": self.stream_batch}
