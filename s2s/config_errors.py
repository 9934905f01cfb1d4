"""Errors and context for config validation (kept apart so stage modules can import them cheaply)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


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

    def error(self, key: str, value: Any, expected: str | Iterable[Any]) -> ConfigError:
        return ConfigError(f"{self.group}.{key}", value, expected)
