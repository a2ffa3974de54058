"""waymark.recovery."""
