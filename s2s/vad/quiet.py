"""Where a real person's speech has stopped sounding, before Silero hears it stop (it goes on hearing speech for
0.03-0.3 s after the last word): the VAD starts the work on a turn after a short quiet (``vad.quiet_below``)."""
from __future__ import annotations

from collections import deque

import numpy as np

from s2s import audio

# the background's level: the 10th percentile of the RMS of the last 1.6 s before speech, or the RMS of the
# utterance's quietest frame if higher (a recording's hiss heard between words; a file may start in digital silence)
BACKGROUND_FRAMES = 50
LOUDEST_QUIET = 0.1  # a background this loud against the speech's peak cannot tell a quiet pause: Silero alone


class Quiet:
    """Counts the quiet at the end of the open utterance.

    Args:
        below: a frame with no sample above this share of the utterance's peak (nor above six times the
            background's level, :func:`s2s.audio.sound_level`) is quiet; None: none is.
    """

    def __init__(self, below: float | None) -> None:
        self.below = below
        self._background: deque[float] = deque(maxlen=BACKGROUND_FRAMES)  # RMS of frames before speech
        self.begin()

    def before(self, frame: np.ndarray) -> None:
        """A frame with no utterance open: the background."""
        if self.below:
            self._background.append(float(np.sqrt(np.mean(frame ** 2))))

    def begin(self) -> None:
        """An utterance opens."""
        self._floor = float(np.percentile(self._background, 10)) if self._background else 0.0
        self._peak, self._quietest = 0.0, np.inf  # its loudest sample, the RMS of its quietest frame
        self.run = 0  # samples of quiet since the last frame with sound

    def hear(self, frame: np.ndarray) -> bool:
        """Whether ``frame`` of the open utterance is quiet (counted in ``run``)."""
        if not self.below:
            return False
        loudest = float(np.abs(frame).max())
        self._peak = max(self._peak, loudest)
        self._quietest = min(self._quietest, float(np.sqrt(np.mean(frame ** 2))))
        level = audio.sound_level(self._peak, max(self._floor, self._quietest), self.below)
        quiet = level <= LOUDEST_QUIET * self._peak and loudest <= level
        self.run = self.run + len(frame) if quiet else 0
        return quiet
