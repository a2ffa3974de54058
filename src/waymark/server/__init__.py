"""The HTTP /v0 API and SSE over :mod:`waymark.log`."""

from .app import App
from .config import ServerConfig

__all__ = ["App", "ServerConfig"]
