"""waymark.client."""
