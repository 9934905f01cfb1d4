"""The server's settings bind to one signature: conf/server/realtime.yaml's keys, checked like a stage's."""
from __future__ import annotations

import typing

import pytest

from conftest import CONF_DIR, compose_config
from s2s.schema import constraints
from s2s.server.settings import ServerSettings, read_settings


def settings_of(*overrides: str, tmp_path) -> tuple[ServerSettings | None, list[str]]:
    settings, errors = read_settings(compose_config(["server=realtime", *overrides], tmp_path))
    return settings, [str(error) for error in errors]


def test_the_config_group_binds_to_the_signature(tmp_path):
    settings, errors = settings_of("server.max_sessions=3", "server.api_key=", tmp_path=tmp_path)
    assert errors == [] and settings is not None
    assert settings.max_sessions == 3 and settings.api_key is None  # an empty key (S2S_API_KEY="") is no key
    import yaml

    keys = set(yaml.safe_load((CONF_DIR / "server" / "realtime.yaml").read_text()))
    assert keys == set(ServerSettings.__dataclass_fields__)  # the file gives a value for every key, no more


@pytest.mark.parametrize("override,expected", [
    ("server.max_sessions=0", "server.max_sessions=0: invalid; expected a number from 1 to 64"),
    ("server.port=70000", "server.port=70000: invalid; expected a number from 0 to 65535"),
    ("server.max_rate=4000", "server.max_rate=4000: invalid; expected a number from 8000 to 192000"),
    ("server.idle_timeout_s=0", "server.idle_timeout_s=0: invalid; expected a number > 0"),
    ("server.max_frame_bytes=many", "server.max_frame_bytes=many: invalid; expected an integer"),
    ("server.api_key=short", "server.api_key=<hidden>: invalid; expected null or a key of 8+ characters"),
    ("server.host=", "server.host=: invalid; expected a host name or address"),
    ("+server.workers=4", "server.workers=4: invalid; expected a known key; "),
    ("server.engine=swarm", "server.engine=swarm: invalid; expected one of local, ray"),
    ("server.visemes=maybe", "server.visemes=maybe: invalid; expected true or false"),
    ("server.replica_cpus=2", "server.replica_cpus=2: invalid; expected 1 with server.engine=local (replicas need "
                              "server.engine=ray)"),
    ("server.ice_servers=[{urls:'http://stun.example.org'}]", "server.ice_servers[0].urls=http://stun.example.org: "
                                                             "invalid; expected one URL or a list of them, each "
                                                             "starting with stun:, stuns:, turn:, turns:"),
    ("server.ice_servers=[{urls:'turn:turn.example.org:3478'}]", "server.ice_servers[0].credential=<hidden>: "
                                                                "invalid; expected a TURN server's username"),
    ("server.ice_servers=[{url:'stun:stun.example.org'}]", "server.ice_servers[0]={'url': 'stun:stun.example.org'}:"
                                                          " invalid; expected {urls: "),
    ("server.call_connect_timeout_s=0", "server.call_connect_timeout_s=0: invalid; expected a number from 1 to 300"),
])
def test_a_bad_value_is_one_line_naming_the_key(override, expected, tmp_path):
    settings, [message] = settings_of(override, tmp_path=tmp_path)
    assert settings is None and message.startswith(expected), message


def test_ice_servers_for_webrtc_calls_bind_as_aiortc_takes_them(tmp_path):
    settings, errors = settings_of("server.ice_servers=[{urls:'stun:stun.example.org:3478'},{urls:["
                                   "'turn:turn.example.org:3478','turns:turn.example.org:5349'],username:u,"
                                   "credential:p}]", tmp_path=tmp_path)
    assert errors == [] and settings is not None
    assert settings.ice_servers[1] == {"urls": ["turn:turn.example.org:3478", "turns:turn.example.org:5349"],
                                       "username": "u", "credential": "p"}


def test_rates_must_be_in_order_and_every_bad_key_is_reported_at_once(tmp_path):
    _, messages = settings_of("server.min_rate=48000", "server.max_rate=16000", tmp_path=tmp_path)
    assert messages == ["server.min_rate=48000: invalid; expected at most server.max_rate (16000)"]
    _, messages = settings_of("server.port=-1", "server.max_sessions=65", "~server.host", tmp_path=tmp_path)
    assert sorted(m.split(":")[0] for m in messages) == ["server.host=<missing>", "server.max_sessions=65",
                                                         "server.port=-1"]


def test_every_numeric_setting_declares_its_range():
    hints = typing.get_type_hints(ServerSettings.__init__, include_extras=True)
    hints.pop("return", None)
    bases = {name: typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
             for name, hint in hints.items()}
    numeric = [name for name, base in bases.items() if base in (int, float)]
    assert len(numeric) == 12 and [name for name in numeric if not constraints(hints[name])] == []
