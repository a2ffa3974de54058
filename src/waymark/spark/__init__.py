"""waymark.spark."""
