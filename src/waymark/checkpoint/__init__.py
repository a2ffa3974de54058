"""waymark.checkpoint."""
