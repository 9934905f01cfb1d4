"""s2s: a declarative speech-to-speech pipeline runner (VAD -> STT -> LLM -> TTS) driven by Hydra configs."""

__version__ = "0.1.0"

from s2s import resolvers as _resolvers

_resolvers.register()
