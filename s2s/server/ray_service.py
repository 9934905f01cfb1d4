"""A Serve application builder for clusters without a driver: ``serve run``, ``serve deploy``, KubeRay's RayService.

``python run.py server=realtime server.engine=ray`` is the driver: it composes the config, starts or joins Ray,
deploys and stops the application. A cluster managed by Serve's own tools instead imports
``s2s.server.ray_service:app`` with arguments::

    serve run s2s.server.ray_service:app overrides="llm=echo server.replicas=2 server.host=0.0.0.0"

    # serveConfigV2 of a RayService (or a `serve deploy` config file)
    applications:
      - name: s2s
        import_path: s2s.server.ray_service:app
        route_prefix: null
        args: {overrides: "server.replicas=4 server.host=0.0.0.0", output_dir: /data/s2s}

The config is composed once, here (the platform detected where the builder runs, as ``run.py`` would), checked
as the command line checks it, and shipped resolved to every replica; the front listens on the head node.
"""
from __future__ import annotations

import secrets
import shlex
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.server.launch import checked
from s2s.server.ray_app import build_app


def app(args: dict[str, Any]) -> Any:
    """The Serve application of ``server=realtime server.engine=ray <overrides>``.

    Args:
        args: ``overrides`` (a string, split like a shell line, or a list) and ``output_dir`` (where each
            replica writes its sessions' transcripts and metrics, on its node; default ``outputs/serve``).

    Returns:
        The bound application (front and replicas), for Serve to run.

    Raises:
        ValueError: the config's problems, one line each, as the command line reports them.
    """
    from s2s.compose import compose, prepare_argv

    overrides = args.get("overrides", "")
    overrides = shlex.split(overrides) if isinstance(overrides, str) else [str(o) for o in overrides]
    output_dir = Path(str(args.get("output_dir", "outputs/serve"))).resolve()
    cfg = compose(prepare_argv(["server=realtime", "server.engine=ray", *overrides]), output_dir, hydra_node=False)
    try:
        specs = validate(cfg)
    except ConfigErrors as errors:
        raise ValueError("\n".join(f"config error: {error}" for error in errors.errors)) from None
    settings, problems = checked(cfg, specs)
    if settings is None:
        raise ValueError("\n".join(f"config error: {problem}" for problem in problems))
    config: Any = OmegaConf.to_container(cfg, resolve=True)
    return build_app(config, settings, secrets.token_urlsafe(24), None, None)
