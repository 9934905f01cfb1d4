"""The realtime server: OpenAI Realtime events over WebSocket or WebRTC <-> the messages of one graph per session.

``python run.py server=realtime`` (extra ``server``; WebRTC calls with extra ``webrtc``; ``server.engine=ray``
spreads the sessions over Ray Serve replicas, extra ``ray``). A session's source and sink are the socket or the
call; every other stage comes from the composed
config, so profiles, platforms and overrides apply unchanged. Protocol parsing, validation and error events
live here; stages never see JSON or sockets.
"""
from __future__ import annotations

from typing import Any


def main(cfg: Any, specs: Any) -> int:
    """Serve (or, with ``dry_run=true``, print the graph each session would get); returns the exit code."""
    from s2s.server.launch import main as serve

    return serve(cfg, specs)
