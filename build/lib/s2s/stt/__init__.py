"""Speech to text."""
