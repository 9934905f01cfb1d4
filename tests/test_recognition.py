"""The default STT (packaged Whisper tiny.en, as conf/stt/faster_whisper.yaml sets it) across espeak voices and rates.

Each sentence is checked on words that int8 and float32, greedy and beam 5, all heard in every voice and rate when
this was measured (AMD EPYC), so the test keeps a margin on another CPU; marginal words are left out (see SENTENCES).
The exception is "France": greedy decoding hears "capital and friends" on an Intel Xeon (and at 130 words a minute
here); the default's beam 5 heard it in every voice and rate here, and on that Xeon.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import compose_config

from s2s import audio
from s2s.messages import SpeechSegment, Transcript
from s2s.stt.faster_whisper import FasterWhisperSTT

pytestmark = pytest.mark.slow

VOICES = ["en-us", "en-gb", "en+f3"]
RATES = [130, 150, 170, 190]
# sentence -> words the default must hear in every voice and rate. Left out as marginal: "today" (en+f3 at 170 gives
# "London, okay?" whatever the precision or beam), "story", "minutes" (a greedy decode misses each once), and "Turn on
# the kitchen lights." (en+f3 at 190 comes back as "Do not look at your life.").
SENTENCES = {
    "What is the capital of France?": ["capital", "france"],
    "How is the weather in London today?": ["weather", "london"],
    "Please tell me a story about a dragon.": ["tell"],
    "Good morning to you.": ["morning"],
}


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


@pytest.fixture(scope="module")
def default_stt():
    """The STT stage exactly as the default config builds it (compute_type, beam_size from the option file)."""
    cfg = compose_config([])
    stage = FasterWhisperSTT(**{key: value for key, value in cfg.stt.items() if key != "_target_"})
    stage.setup()
    stage.warm_up()
    yield stage
    stage.close()


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("voice", VOICES)
def test_default_stt_hears_espeak_voices_and_rates(default_stt, voice, rate, tmp_path):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    missed = {}
    for index, (sentence, expected) in enumerate(SENTENCES.items()):
        path = tmp_path / f"{index}.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(path), sentence], check=True)
        [out] = list(default_stt.process(SpeechSegment(audio.read_audio(path, 16000), 16000, index, 0.0, 1.0)))
        assert isinstance(out, Transcript)
        if lost := [word for word in expected if word not in words(out.text)]:
            missed[sentence] = (out.text, lost)
    assert not missed, missed
