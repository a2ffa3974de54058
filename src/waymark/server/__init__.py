"""waymark.server."""
