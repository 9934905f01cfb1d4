"""Text to speech backends."""
