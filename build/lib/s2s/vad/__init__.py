"""Voice activity detection: finds user utterances in the input stream."""
