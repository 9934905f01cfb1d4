"""The real sounddevice path under the ALSA null device, and the clear messages when audio is missing."""
from __future__ import annotations

import importlib.abc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from s2s.io.sound import AudioDeviceError, MicSource, import_sounddevice

DATA = Path(__file__).parent / "data"
ALSA = "/usr/share/alsa/alsa.conf"

pytestmark = pytest.mark.skipif(not Path(ALSA).exists(), reason="needs ALSA (Linux with libasound2)")


def alsa_env(conf: str) -> dict[str, str]:
    return {"ALSA_CONFIG_PATH": f"{ALSA}:{DATA / conf}"}


FLOW_SCRIPT = textwrap.dedent("""
    import sys, json
    sys.path.insert(0, {root!r})
    import numpy as np
    from s2s.io.sound import MicSource, SpeakerSink
    from s2s.messages import AudioChunk, ReplyAudio
    mic = MicSource(sample_rate=16000, chunk_ms=32)
    mic.setup()
    chunks = []
    for message in mic.stream():
        chunks.append(message)
        if len(chunks) == 5:
            break
    mic.close()
    speaker = SpeakerSink()
    speaker.setup()
    for turn in range(2):
        list(speaker.process(ReplyAudio(np.zeros(4800, dtype=np.float32), 24000, turn)))
    speaker.close()
    print(json.dumps({{"types": sorted({{type(c).__name__ for c in chunks}}), "sizes": [len(c.samples) for c in chunks],
                      "rates": sorted({{c.sample_rate for c in chunks}}), "speaker_rate": speaker.sample_rate}}))
""")


def test_mic_and_speaker_flow_through_portaudio(tmp_path):
    result = subprocess.run([sys.executable, "-c", FLOW_SCRIPT.format(root=str(ROOT))], capture_output=True,
                            text=True, timeout=60, env={**os.environ, **alsa_env("asound_null.conf")})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"types": ["AudioChunk"], "sizes": [512] * 5, "rates": [16000], "speaker_rate": 24000}


def test_live_conversation_runs_and_stops_on_ctrl_c(tmp_path):
    import signal
    import time

    out = tmp_path / "run"
    process = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "source=mic", "sink=speaker", "llm=echo",
                                f"hydra.run.dir={out}"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env={**os.environ, **alsa_env("asound_null.conf")})
    seen = []
    for line in process.stdout:  # wait until the user is told to speak
        seen.append(line)
        if line.startswith("listening:"):
            break
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=30)
    output = "".join(seen) + rest
    assert process.returncode == 130, output[-3000:]
    assert "set up source (MicSource)" in output and "set up sink (SpeakerSink)" in output
    assert "listening: speak now, Ctrl-C to stop" in output
    assert output.index("set up tts") < output.index("listening:")  # said once everything is ready
    assert json.loads((out / "metrics.json").read_text())["status"] == "interrupted"


@pytest.mark.parametrize("args,fragment", [(["source=mic"], "source=mic: no usable audio input device"),
                                           (["sink=speaker"], "sink=speaker: no usable audio output device")])
def test_no_audio_device_gives_one_clear_line(tmp_path, args, fragment):
    result = run_cli(*args, "llm=echo", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                     env=alsa_env("asound_nodevice.conf"))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert fragment in errors[0] and "source=file" in errors[0]
    assert "set up stt" not in result.stderr + result.stdout  # failed before any model loaded


class _NoPortAudio(importlib.abc.MetaPathFinder):
    """Makes `import sounddevice` fail the way it does when Debian's libportaudio2 is missing."""

    def find_spec(self, name, path=None, target=None):
        if name == "sounddevice":
            raise OSError("PortAudio library not found")
        return None


def test_missing_portaudio_is_named(monkeypatch):
    monkeypatch.delitem(sys.modules, "sounddevice", raising=False)
    finder = _NoPortAudio()
    sys.meta_path.insert(0, finder)
    try:
        with pytest.raises(AudioDeviceError) as caught:
            MicSource().setup()
    finally:
        sys.meta_path.remove(finder)
    message = str(caught.value)
    assert "PortAudio" in message and "libportaudio2" in message and "source=file" in message
    with pytest.raises(AudioDeviceError, match="sounddevice package"):
        monkeypatch.setitem(sys.modules, "sounddevice", None)
        import_sounddevice("sink=speaker")
