"""waymark: move data through pipelines without losing or duplicating it across crashes."""

__version__ = "0.1.0"
