"""waymark.log."""
