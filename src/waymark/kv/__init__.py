"""waymark.kv."""
