"""The shared audio module: every format the pipeline accepts ends up float32 mono at the asked rate."""
import numpy as np
import pytest
import soundfile

from s2s import audio


def test_int16_and_float_round_trip():
    samples = np.array([0, 16384, -32768, 32767], dtype=np.int16)
    as_float = audio.to_float32(samples)
    assert as_float.dtype == np.float32
    assert as_float[1] == pytest.approx(0.5, abs=1e-4) and as_float[2] == pytest.approx(-1.0, abs=1e-4)
    np.testing.assert_array_equal(audio.float_to_int16(np.array([2.0, -2.0], dtype=np.float32)), [32767, -32767])


def test_unsigned_8bit_is_centred():
    assert audio.to_float32(np.array([128], dtype=np.uint8))[0] == pytest.approx(0.0, abs=1e-2)


def test_mono_from_either_layout():
    left_right = np.stack([np.ones(100), -np.ones(100) * 0.5], axis=1).astype(np.float32)  # (n, 2)
    assert audio.to_mono(left_right).shape == (100,)
    assert audio.to_mono(left_right)[0] == pytest.approx(0.25)
    assert audio.to_mono(left_right.T).shape == (100,)  # (2, n) as models return
    assert audio.to_mono(np.zeros((1, 50), dtype=np.float32)).shape == (50,)


def test_resample_keeps_duration_and_pitch():
    rate_in, rate_out = 44100, 16000
    t = np.arange(rate_in) / rate_in
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    out = audio.resample(tone, rate_in, rate_out)
    assert len(out) == pytest.approx(rate_out, abs=2)
    spectrum = np.abs(np.fft.rfft(out))
    assert np.argmax(spectrum) * rate_out / len(out) == pytest.approx(440, abs=2)


def test_to_pipeline_handles_tensors_and_non_finite():
    torch = pytest.importorskip("torch")
    block = torch.tensor([[0.1, float("nan"), 0.3]])
    out = audio.to_pipeline(block, 24000)
    assert out.dtype == np.float32 and out.shape == (3,) and np.all(np.isfinite(out))


@pytest.mark.parametrize("subtype,channels,rate", [("PCM_16", 2, 44100), ("FLOAT", 1, 22050),
                                                   ("PCM_24", 1, 48000), ("PCM_U8", 1, 8000)])
def test_read_audio_any_wav(tmp_path, subtype, channels, rate):
    t = np.arange(rate // 2) / rate
    tone = 0.5 * np.sin(2 * np.pi * 300 * t)
    data = np.stack([tone] * channels, axis=1) if channels > 1 else tone
    path = tmp_path / "x.wav"
    soundfile.write(path, data, rate, subtype=subtype)
    out = audio.read_audio(path, 16000)
    assert out.dtype == np.float32 and out.ndim == 1
    assert len(out) == pytest.approx(8000, abs=2)
    assert 0.4 < np.abs(out).max() < 0.6


def test_flac_is_read(tmp_path):
    path = tmp_path / "x.flac"
    soundfile.write(path, np.zeros(1600, dtype=np.int16), 16000)
    assert audio.probe_audio(path) == (16000, 1, 0.1)


@pytest.mark.parametrize("content,reason", [(b"", "empty"), (b"this is not audio at all" * 10, "not a readable"),
                                            (None, "no audio frames")])
def test_probe_explains_unusable_files(tmp_path, content, reason):
    path = tmp_path / "bad.wav"
    if content is None:
        soundfile.write(path, np.zeros(0, dtype=np.int16), 16000)
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=reason):
        audio.probe_audio(path)


def test_chunks_pad_the_last_block():
    blocks = list(audio.chunks(np.ones(1000, dtype=np.float32), 512))
    assert [len(b) for b in blocks] == [512, 512]
    assert blocks[1][488:].sum() == 0


def _sound(n):
    return np.full(n, 0.5, np.float32)


def _quiet(n):
    return np.zeros(n, np.float32)


def test_pause_shaper_cuts_the_lead_in_and_the_tail_but_keeps_pauses_inside_a_chunk():
    shaper = audio.PauseShaper(1000, lead_s=0.05, tail_s=0.25)
    first = shaper.feed(np.concatenate([_quiet(260), _sound(100), _quiet(80)]))
    assert len(first) == 50 + 100  # 50 ms of the lead-in, then the sound; the 80 ms after it is held back
    second = shaper.feed(np.concatenate([_quiet(40), _sound(50), _quiet(600)]))
    assert len(second) == 80 + 40 + 50  # more sound followed: the pause inside the chunk comes out whole
    assert len(shaper.finish()) == 250  # the chunk ended: its tail is cut to 250 ms


def test_pause_shaper_never_holds_sound_back_and_forgets_silent_blocks_before_it():
    shaper = audio.PauseShaper(1000, lead_s=0.05, tail_s=0.25)
    assert len(shaper.feed(_quiet(300))) == 0 and len(shaper.feed(_quiet(300))) == 0  # a streamed lead-in
    out = shaper.feed(_sound(10))
    assert len(out) == 60 and np.all(out[-10:] == 0.5)
    assert len(shaper.finish()) == 0
    assert len(shaper.finish()) == 0 and len(audio.PauseShaper(1000, 0.05, 0.25).finish()) == 0  # all silent: nothing


def test_sound_bounds():
    assert audio.sound_bounds(np.concatenate([_quiet(5), _sound(3), _quiet(2)])) == (5, 8)
    assert audio.sound_bounds(_quiet(10)) is None


def test_reblock_regroups_without_losing_or_padding_and_closes_its_source():
    closed = []

    def source():
        try:
            for size in (300, 50, 900, 10):
                yield np.full(size, size / 1000, dtype=np.float32)
        finally:
            closed.append(True)

    blocks = list(audio.reblock(source(), 400))
    assert [len(block) for block in blocks] == [400, 400, 400, 60] and closed == [True]
    assert np.concatenate(blocks).tolist() == np.concatenate(
        [np.full(size, size / 1000, dtype=np.float32) for size in (300, 50, 900, 10)]).tolist()
    early = audio.reblock(source(), 100)
    next(early)
    early.close()
    assert closed == [True, True]
