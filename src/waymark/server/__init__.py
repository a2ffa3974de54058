"""The HTTP /v0 API and SSE over :mod:`waymark.log`."""

from .app import App
from .handlers import Settings

__all__ = ["App", "Settings"]
