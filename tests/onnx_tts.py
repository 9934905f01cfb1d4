"""What the tests of TTS stages that run an ONNX voice on onnxruntime with espeak-ng phonemes (Piper, Kitten)
share: the espeak-ng mark, the onnxruntime module as a fixture, and the feeds a spied session was given."""
from __future__ import annotations

import shutil

import pytest

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="espeak-ng is not installed (apt-get install espeak-ng)")


@pytest.fixture(scope="session")
def onnxruntime():
    import onnxruntime

    return onnxruntime


def fed(calls) -> list[dict]:
    """The input feed of each recorded ``InferenceSession.run(output_names, input_feed)``."""
    return [call.args[2] for call in calls]
