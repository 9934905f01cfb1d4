"""Errors, markers and context for config validation (kept apart so stage modules can import them cheaply).

A constructor's annotations are the schema the validator reads: ``Annotated[int, Range(1)]`` bounds a number,
``Annotated[str, OneOf(...)]`` limits a string, ``Annotated[str, MUST_EXIST]`` marks a path that must exist.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


EXIT_CONFIG = 2  # the exit code of every config error, from the command line, a run or the server
MUST_EXIST = "must-exist"  # marker for typing.Annotated: the path (when not None) must exist


class ConfigError(ValueError):
    """One problem in the composed config, reported as a single line: key, bad value, what would be valid."""

    def __init__(self, key: str, value: Any, expected: str | Iterable[Any]) -> None:
        if not isinstance(expected, str):
            expected = "one of " + ", ".join(str(choice) for choice in expected)
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"{key}={value!s}: invalid; expected {expected}")


class ConfigErrors(ValueError):
    """Several config problems, all reported at once."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(error) for error in errors))


@dataclass(frozen=True)
class ValidationContext:
    """What validation knows about the run: the config group being checked and the target platform."""

    group: str  # e.g. "tts"; error keys are "<group>.<key>"
    platform: str  # e.g. "linux", "macos"
    os: str  # linux | macos | windows
    accelerator: str  # cpu | cuda | mps
    unavailable: Mapping[str, str] = field(default_factory=dict)  # runtime -> why it cannot run here (platform config)
    here: bool = False  # the platform judged is the machine this runs on: what is installed here counts
    fed: tuple[type, ...] = ()  # the data types the stage before it emits (() when unknown), e.g. SpeechSegment

    def error(self, key: str, value: Any, expected: str | Iterable[Any]) -> ConfigError:
        return ConfigError(f"{self.group}.{key}", value, expected)


@dataclass(frozen=True)
class Range:
    """A bound on a numeric constructor argument, read by the validator: ``Annotated[int, Range(1)]``.

    ``None`` leaves a side open; ``exclusive`` makes both given bounds strict (e.g. a probability in (0, 1)).
    """

    low: float | None = None
    high: float | None = None
    exclusive: bool = False

    def check(self, value: Any) -> bool:
        if self.low is not None and (value <= self.low if self.exclusive else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.exclusive else value > self.high))

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            ends = "exclusive" if self.exclusive else "inclusive"
            return f"a number from {self.low:g} to {self.high:g} ({ends})"
        if self.low is not None:
            return f"a number {'>' if self.exclusive else '>='} {self.low:g}"
        return f"a number {'<' if self.exclusive else '<='} {self.high:g}"


@dataclass(frozen=True)
class OneOf:
    """A string limited to a set known at import time (language codes): ``Annotated[str, OneOf(...)]``."""

    choices: tuple[str, ...]

    def check(self, value: Any) -> bool:
        return value in self.choices

    def describe(self) -> str:
        return "one of " + ", ".join(self.choices)


RATE = Range(8000, 192000)  # an audio sample rate in Hz
