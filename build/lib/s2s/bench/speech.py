"""Speech for the benchmarks: espeak-ng voices and rates, and recordings of real people that packages ship.

No model hub and no network: espeak-ng is a Debian/Homebrew program (``scripts/setup.sh`` installs it), and the
recordings are files inside installed wheels, used where they are installed (gradio ships a few short film
quotes among its media assets; the test install brings it) and skipped otherwise.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from s2s import audio
from s2s.models import package_file

RATE = 16000
# (package, file inside it, what is said): real human speech, each checked by ear and against Whisper
RECORDINGS = [
    ("gradio", "media_assets/audio/heath_ledger.mp3", "If you're good at something, never do it for free."),
    ("gradio", "media_assets/audio/cate_blanch_2.mp3", "I trust you had an historic evening."),
    ("gradio", "media_assets/audio/audio_sample.wav", "Thank you."),
]


@dataclass
class Clip:
    """One recording: a name for the tables, the samples at 16 kHz and, where known, what is said."""

    name: str
    samples: np.ndarray
    text: str = ""


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def espeak(text: str, voice: str, rate: int, path: Path) -> Clip:
    """``text`` spoken by espeak-ng in ``voice`` at ``rate`` words a minute, written to ``path`` and read back."""
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(path), text], check=True)
    return Clip(f"espeak {voice} {rate} wpm", audio.read_audio(path, RATE), text)


def recordings() -> list[Clip]:
    """The real recordings of :data:`RECORDINGS` whose package is installed (found without importing it)."""
    clips = []
    for package, name, text in RECORDINGS:
        path = package_file(package, name)
        if path is not None and path.is_file():
            clips.append(Clip(f"{Path(name).name} ({package})", audio.read_audio(path, RATE), text))
    return clips
