"""Language models that turn a user transcript into a streamed reply."""
