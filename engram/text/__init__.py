"""Text handling: secret scrubbing, relative dates, language guess, token counting."""
