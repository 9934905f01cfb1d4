"""Benchmarks: a TTS round trip judged by Whisper (``bench=tts``) and the runner's own overhead
(``python -m s2s.bench runner``)."""
