"""The ``_target_`` allowlist at the one point where Hydra composes every config it will act on.

:func:`s2s.preflight.check` explains a command line ahead of Hydra, but only for s2s's own primary config; with
``-cp``, ``-cn`` or ``-cd`` Hydra composes another one, and it instantiates ``hydra.callbacks``, the launcher and
the sweeper from it before the app sees anything. So the guard wraps the method that every composition goes
through, whatever the flags (runs, sweeps and their jobs, ``--cfg``, ``--info``, the compose API): Hydra's
``ConfigLoaderImpl.load_configuration`` (hydra-core is pinned below 1.4, so the hook point is fixed; a test
checks it). A composed config naming any callable outside the allowlist (:func:`s2s.allowlist.target_errors`)
stops the program with one ``config error:`` line per target and exit code 2, before anything is instantiated.

``--experimental-rerun`` is refused outright: it unpickles a file, and unpickling alone can run any code.
"""
from __future__ import annotations

import functools
import sys
from typing import Any

from s2s.config_errors import EXIT_CONFIG

RERUN_FLAG = "--experimental-rerun"
RERUN_REFUSAL = (f"{RERUN_FLAG}: refused for safety (it unpickles a file, which can run any code); run again "
                 "with the overrides saved in the run's .hydra/overrides.yaml instead")


class UnsafeConfig(SystemExit):
    """A composed config named a callable s2s does not instantiate; the lines say which."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(EXIT_CONFIG)
        self.problems = problems


def refuse(problems: list[str]) -> None:
    for problem in problems:
        print(f"config error: {problem}", file=sys.stderr)
    raise UnsafeConfig(problems)


def install() -> None:
    """Wrap Hydra's config loader once (idempotent): every config it composes is checked before it returns."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    original = ConfigLoaderImpl.load_configuration
    if getattr(original, "s2s_guarded", False):
        return

    @functools.wraps(original)
    def load_configuration(self: Any, *args: Any, **kwargs: Any) -> Any:
        from s2s.allowlist import target_errors

        cfg = original(self, *args, **kwargs)
        if problems := [str(error) for error in target_errors(cfg)]:
            refuse(problems)
        return cfg

    load_configuration.s2s_guarded = True  # type: ignore[attr-defined]
    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]


def check_flags(argv: list[str]) -> list[str]:
    """Flags refused whatever the config: ``--experimental-rerun`` (it unpickles a file)."""
    return [RERUN_REFUSAL] if any(arg.split("=", 1)[0] == RERUN_FLAG for arg in argv) else []
