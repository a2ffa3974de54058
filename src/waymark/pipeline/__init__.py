"""waymark.pipeline."""
