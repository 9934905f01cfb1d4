"""Benchmarks: a TTS round trip judged by Whisper (``experiment=tts_benchmark``) and the runner's own overhead
(``python -m s2s.bench runner``)."""
