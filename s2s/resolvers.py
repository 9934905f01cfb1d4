"""OmegaConf resolvers the configs use; registered when ``s2s`` is imported."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> str:
    """``${s2s.sample:question.wav}``: path of a sample file shipped with the package."""
    return str(SAMPLES / name)


def register() -> None:
    if not OmegaConf.has_resolver("s2s.sample"):
        OmegaConf.register_new_resolver("s2s.sample", sample)
