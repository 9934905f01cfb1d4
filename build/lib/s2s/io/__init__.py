"""Audio sources and sinks: files, microphone, speaker."""
