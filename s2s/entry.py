"""The entry: the ``s2s`` command, ``python -m s2s`` and ``python run.py`` all start here, where Hydra's main is
written once; shortcuts name the common ways to run.

::

    s2s [overrides]          python run.py [overrides]: one run over the configured source and sink
    s2s local [overrides]    on the microphone and the speaker (source=mic sink=speaker)
    s2s serve [overrides]    the realtime server (server=realtime)
    s2s talk [--url ...]     python -m s2s.client: talk to a running server through the microphone and speaker

Overrides and Hydra's flags (``--cfg job``, ``-m``, ``--help``) work as with ``run.py``; the platform is
detected as there. A shortcut's own overrides give way to the user's (``s2s local sink=file`` keeps the file).
"""
from __future__ import annotations

import sys

from s2s import preflight, compose, hydra_guard

# subcommand -> the overrides it stands for (added unless the user sets the same key)
SHORTCUTS: dict[str, tuple[str, ...]] = {"local": ("source=mic", "sink=speaker"), "serve": ("server=realtime",)}
USAGE = __doc__.split("::", 1)[1].split("\n\n")[1]
# Hydra's flags that only show something (the config, help) and run no job: the check ahead of Hydra (a second
# composition, and every stage's schema) is skipped for them, so `s2s --cfg job` costs about what Hydra's own
# does; the target allowlist still holds, and Hydra reports an unknown key itself
SHOW_ONLY = frozenset({"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help"})


def with_shortcut(command: str | None, args: list[str]) -> list[str]:
    """``args`` with the overrides ``command`` stands for, those the user already set left out."""
    given = {arg.lstrip("+~").split("=", 1)[0] for arg in args if "=" in arg and not arg.startswith("-")}
    return [*args, *(o for o in SHORTCUTS.get(command or "", ()) if o.split("=", 1)[0] not in given)]


def run_hydra(args: list[str]) -> int:
    """What ``s2s args`` and ``python run.py args`` do: platform, one-line config errors (exit 2), then
    Hydra's own run of :func:`s2s.job.run`."""
    import hydra
    from omegaconf import DictConfig

    @hydra.main(config_path=str(compose.CONF_DIR), config_name="config", version_base="1.3")
    def main(cfg: DictConfig) -> int:
        from s2s import app, job  # here: a command that only shows the config needs neither

        code = job.run(cfg)
        if code and not app.in_multirun():
            sys.exit(code)  # a sweep keeps going: the failed job becomes a row of the summary
        return code

    from s2s.platform import fix_allocator

    fix_allocator()  # before any model loads: freed models' memory goes back (sweeps, pooled pipelines)
    sys.argv = ["s2s", *compose.prepare_argv(args)]
    hydra_guard.install()  # before anything is composed: every config Hydra composes is checked
    if not set(sys.argv[1:]) & SHOW_ONLY and (problems := preflight.check(sys.argv[1:])):
        preflight.fail(problems)
    main()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``s2s`` (``[project.scripts]``) and ``python -m s2s``.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0, 2 for a config error (raised as SystemExit), the run's or the client's own.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in (*SHORTCUTS, "talk") else None
    args = argv[1:] if command else argv
    if command == "talk":
        from s2s import client

        return client.main(args, prog="s2s talk")
    if not command and any(arg in ("-h", "--help") for arg in args):
        print(f"usage:\n{USAGE}\n")  # then Hydra's help: the config groups and their options
    return run_hydra(with_shortcut(command, args))
