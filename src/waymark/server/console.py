"""The web console's static files, served at ``/ui`` beside the API (docs/console.md).

The console is plain JavaScript modules and CSS shipped inside the package
(``waymark/server/ui``): nothing is built, nothing is fetched from elsewhere. Every number
it shows comes from the public /v0 API with the user's token, so it is a client like any
other and is not part of the endpoint table or the OpenAPI document.
"""

from __future__ import annotations

from importlib import resources

from .errors import method_not_allowed, not_found
from .http import Response

PREFIX = "/ui"
_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".svg": b"image/svg+xml",
}
# The page may load only its own files and talk only to its own server.
_HEADERS = (
    (b"cache-control", b"no-cache"),
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'"),
)  # fmt: skip


class Console:
    """The console's files, read once from the package into memory."""

    def __init__(self) -> None:
        folder = resources.files(__package__) / "ui"
        self.files: dict[str, Response] = {}
        for entry in folder.iterdir():
            content_type = _TYPES.get(entry.name[entry.name.rfind(".") :])
            if entry.is_file() and content_type is not None:
                self.files[f"{PREFIX}/{entry.name}"] = Response(
                    entry.read_bytes(), content_type=content_type, headers=_HEADERS
                )
        # The page itself: the console routes between its pages after a '#'.
        self.files[PREFIX] = self.files[f"{PREFIX}/"] = self.files[f"{PREFIX}/index.html"]

    @staticmethod
    def owns(path: str) -> bool:
        return path == PREFIX or path.startswith(PREFIX + "/")

    def serve(self, method: str, path: str) -> Response:
        """The file at ``path`` (a path :meth:`owns`), 404 not_found if there is none."""
        if method not in ("GET", "HEAD"):
            return method_not_allowed(method, ("GET", "HEAD"))
        found = self.files.get(path)
        return not_found(path) if found is None else found
