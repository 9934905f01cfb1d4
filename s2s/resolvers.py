"""OmegaConf resolvers the configs use; registered when ``s2s`` is imported."""
from __future__ import annotations

import threading
from pathlib import Path

from omegaconf import OmegaConf

SAMPLES = Path(__file__).parent / "samples"
_claimed: dict[str, str] = {}
_claim_lock = threading.Lock()


def sample(name: str) -> str:
    """``${s2s.sample:question.wav}``: path of a sample file shipped with the package."""
    return str(SAMPLES / name)


def fresh_dir(path: str) -> str:
    """``${s2s.fresh_dir:outputs/...}``: ``path``, or ``path-2``, ``-3``... when another run already has it.

    The folder is claimed by creating it (an atomic step, so two runs started in the same second never share
    one); within a process the same request gets the same answer, since Hydra resolves the key more than once.
    """
    with _claim_lock:
        if path in _claimed:
            return _claimed[path]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, 10_000):
            candidate = path if attempt == 1 else f"{path}-{attempt}"
            try:
                Path(candidate).mkdir()
            except FileExistsError:
                continue
            _claimed[path] = candidate
            return candidate
        raise RuntimeError(f"no free run folder next to {path}")


def help_groups() -> str:
    """``${s2s.help_groups:}``: the config groups a user picks and their options, for ``--help``."""
    from s2s.compose import config_groups, group_options

    return "\n".join(f"  {group}: {', '.join(group_options(group))}" for group in config_groups())


def register() -> None:
    if not OmegaConf.has_resolver("s2s.sample"):
        OmegaConf.register_new_resolver("s2s.sample", sample)
    if not OmegaConf.has_resolver("s2s.help_groups"):
        OmegaConf.register_new_resolver("s2s.help_groups", help_groups)
    if not OmegaConf.has_resolver("s2s.fresh_dir"):
        # cached: a sweep's job configs copy the sweep's resolver cache, so every job sees the same folder
        OmegaConf.register_new_resolver("s2s.fresh_dir", fresh_dir, use_cache=True)
