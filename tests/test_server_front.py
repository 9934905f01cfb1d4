"""The front of server.engine=ray without Ray: a relayed session, then the front stopping (as Serve stops it).

The replica is a real realtime server (s2s.api.Server, llm=echo) that takes only the replica key; the front is
the same class Ray Serve runs, on its own loop thread, told of the replica as a heartbeat would tell it.
"""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from s2s.api import Server
from s2s.server.ray_app import LoopThread
from s2s.server.relay import RESTART_CLOSE, Relay
from s2s.server.settings import read_settings

CLIENT_KEY, REPLICA_KEY = "client-key-0123456789abcdef", "replica-key-0123456789abcdef"


def test_a_stopping_front_tells_each_relayed_client_to_connect_again(tmp_path):
    with Server("llm=echo", "server.port=0", f"server.api_key={REPLICA_KEY}", output_dir=tmp_path) as replica:
        configured, _ = read_settings(replica.cfg)  # the front's limits are the config's, as on Ray
        settings = dataclasses.replace(configured, port=0, api_key=CLIENT_KEY)
        front = Relay(settings, 1, REPLICA_KEY)
        front.table.update({"replica": "r1", "actor": "a1", "node": "127.0.0.1", "pid": os.getpid(),
                            "host": "127.0.0.1", "port": replica.port, "max_sessions": 1, "active": 0,
                            "refused": 0})
        loop = LoopThread("test-front", front.run)
        port = loop.start()
        with connect(f"ws://127.0.0.1:{port}/v1/realtime", additional_headers={"Authorization": f"Bearer {CLIENT_KEY}"},
                     open_timeout=10) as client:
            assert json.loads(client.recv(timeout=30))["type"] == "session.created"
            loop.stop()  # what Serve's graceful shutdown of the front does
            events = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    events.append(json.loads(client.recv(timeout=10)))
        assert [e["type"] for e in events][-1:] == ["error"]
        assert events[-1]["error"]["code"] == "server_error" and "start a new session" in events[-1]["error"]["message"]
        assert closed.value.rcvd is not None and closed.value.rcvd.code == RESTART_CLOSE
        assert not loop.alive


def test_the_front_of_engine_ray_says_it_takes_no_webrtc_calls(tmp_path):
    """Its clients fall back to the WebSocket on this 501 (the browser page does)."""
    import urllib.error
    import urllib.request

    with Server("llm=echo", "server.port=0", f"server.api_key={REPLICA_KEY}", output_dir=tmp_path) as replica:
        configured, _ = read_settings(replica.cfg)
    settings = dataclasses.replace(configured, port=0, api_key=CLIENT_KEY)
    loop = LoopThread("test-front", Relay(settings, 1, REPLICA_KEY).run)
    port = loop.start()
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/realtime/calls", data=b"v=0\r\n",
                                         method="POST", headers={"Content-Type": "application/sdp",
                                                                 "Authorization": f"Bearer {CLIENT_KEY}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 501
        assert "server.engine=local" in json.loads(refused.value.read())["error"]["message"]
    finally:
        loop.stop()
