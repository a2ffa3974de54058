"""Bearer tokens with scopes (docs/security.md).

The tokens file is TOML, one table per token name::

    [tokens.shipper]
    id = "3f9c2a1b7d4e"            # public: picks the entry, never grants anything
    salt = "<hex>"
    sha256 = "<hex of sha256(salt + secret)>"
    scopes = ["write:logs.*"]
    expires = 2026-12-01T12:00:00.000+00:00   # optional: refused 401 token_expired after
    rate_per_s = 50.0                         # optional: requests per second (429 past it)

A secret is ``wmk_<id>_<random>``: 32 random bytes, so one salted SHA-256 stores it as
safely as a slow hash would a password, and checking a request costs a microsecond.
The file never holds a secret, the comparison is constant-time
(:func:`hmac.compare_digest`), and no secret or Authorization header is ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tomllib
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..clock import Clock, SystemClock
from ..protocol.errors import WaymarkError
from ..protocol.scopes import Grant

PREFIX = "wmk"
TOKEN = "waymark.token"  # the ASGI scope key of the calling Token, when auth is on
_BEARER = b"bearer "


@dataclass(frozen=True)
class Token:
    """A token of the file: its name and what it may do (no secret, only its hash)."""

    name: str
    id: str
    salt: bytes
    sha256: bytes
    grants: tuple[Grant, ...]
    expires_ms: int | None = None  # refused with 401 token_expired from then on
    rate_per_s: float | None = None  # admitted requests per second, a second's burst

    def expired(self, now_ms: int) -> bool:
        return self.expires_ms is not None and now_ms >= self.expires_ms

    def matches(self, secret: bytes) -> bool:
        digest = hashlib.sha256(self.salt + secret).digest()
        return hmac.compare_digest(digest, self.sha256)


class TokenFileError(WaymarkError, ValueError):
    """The tokens file cannot be read, or holds an entry that is not a token."""


class Tokens:
    """The tokens of one file, by id; :meth:`verify` finds the caller of a request."""

    def __init__(self, tokens: list[Token]) -> None:
        self.by_id = {t.id: t for t in tokens}
        # Unknown ids still cost one hash, so a miss takes as long as a wrong secret.
        self._decoy = Token("", "", b"\0" * 16, b"\0" * 32, ())

    @classmethod
    def load(cls, path: Path) -> Tokens:
        """Read ``path``; TokenFileError (naming the entry) for anything malformed."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenFileError(f"cannot read tokens file {path}: {exc}") from exc
        return cls(_parse(text, path))

    def verify(self, authorization: bytes | None) -> Token | None:
        """The token an ``Authorization: Bearer <secret>`` header proves, or None."""
        if authorization is None or authorization[:7].lower() != _BEARER:
            return None
        secret = authorization[7:].strip()
        parts = secret.split(b"_", 2)
        token = None
        if len(parts) == 3 and parts[0] == PREFIX.encode():
            token = self.by_id.get(parts[1].decode("latin-1"))
        if token is None:
            self._decoy.matches(secret)
            return None
        return token if token.matches(secret) else None


def _parse(text: str, path: Path) -> list[Token]:
    """The tokens of a tokens file's text, in file order; TokenFileError naming the
    entry for anything malformed."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TokenFileError(f"cannot read tokens file {path}: {exc}") from exc
    tokens = []
    for name, entry in data.get("tokens", {}).items():
        try:
            expires = entry.get("expires")
            if expires is not None and not (
                isinstance(expires, datetime) and expires.tzinfo is not None
            ):
                raise ValueError("expires is a date-time with an offset")
            rate = entry.get("rate_per_s")
            if rate is not None and not (isinstance(rate, int | float) and rate > 0):
                raise ValueError("rate_per_s is a number above 0")
            tokens.append(Token(
                name, str(entry["id"]), bytes.fromhex(entry["salt"]),
                bytes.fromhex(entry["sha256"]),
                tuple(Grant.parse(s) for s in entry["scopes"]),
                None if expires is None else round(expires.timestamp() * 1000),
                None if rate is None else float(rate),
            ))  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TokenFileError(f"{path}: token {name!r} is malformed: {exc}") from None
    ids = [t.id for t in tokens]
    if len(set(ids)) != len(ids):
        raise TokenFileError(f"{path}: two tokens share an id")
    return tokens


def new_token(
    path: Path,
    name: str,
    scopes: list[str],
    *,
    expires_in_s: float | None = None,
    rate_per_s: float | None = None,
    clock: Clock | None = None,
) -> str:
    """Add token ``name`` with ``scopes`` to the file at ``path`` (created if missing,
    mode 0600) and return its secret, which is stored nowhere. ValueError for a bad
    scope or name, or a name the file already has. ``expires_in_s``: the token expires
    this long after ``clock``'s now; ``rate_per_s``: its admitted requests per second."""
    grants = [Grant.parse(s) for s in scopes]
    if not grants:
        raise ValueError("a token needs at least one --scope")
    if expires_in_s is not None and expires_in_s <= 0:
        raise ValueError("--expires-in is a duration above 0")
    if rate_per_s is not None and rate_per_s <= 0:
        raise ValueError("--rate is a number of requests per second above 0")
    expires_ms = None
    if expires_in_s is not None:
        expires_ms = (clock or SystemClock()).now_ms() + round(expires_in_s * 1000)
    _check_name(name)
    existing = Tokens.load(path) if path.exists() else Tokens([])
    if any(t.name == name for t in existing.by_id.values()):
        raise ValueError(f"{path} already has a token named {name!r}")
    token_id = secrets.token_hex(6)
    while token_id in existing.by_id:
        token_id = secrets.token_hex(6)
    secret = f"{PREFIX}_{token_id}_{secrets.token_urlsafe(32)}"
    salt = secrets.token_bytes(16)
    digest = hashlib.sha256(salt + secret.encode()).digest()
    token = Token(name, token_id, salt, digest, tuple(grants), expires_ms, rate_per_s)
    _write(path, [*existing.by_id.values(), token])
    return secret


def parse_duration(text: str) -> float:
    """Seconds of ``90s``, ``15m``, ``1h``, ``7d`` (or a bare number of seconds);
    ValueError for anything else."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise ValueError(
            f"a duration is a number and s, m, h or d (1h, 30m), not {text!r}"
        ) from None
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"a duration is above 0 and finite, not {text!r}")
    return seconds


def revoke_token(path: Path, name: str) -> None:
    """Remove token ``name`` from the file at ``path``; a running server stops
    admitting it, and ends its open streams, on SIGHUP. ValueError if there is none."""
    existing = Tokens.load(path)
    kept = [t for t in existing.by_id.values() if t.name != name]
    if len(kept) == len(existing.by_id):
        raise ValueError(f"{path} has no token named {name!r}")
    _write(path, kept)


def _check_name(name: str) -> None:
    # A name is shown in 403 bodies, the audit log and the console: control characters
    # are refused rather than escaped (a lone surrogate cannot even be written).
    if not name or any(unicodedata.category(c) in ("Cc", "Cs") for c in name):
        raise ValueError(f"token name {name!r} is empty or holds control characters")


def _write(path: Path, tokens: list[Token]) -> None:
    """Write the whole file anew (a temporary file renamed over it, mode 0600), after
    checking that it reads back as exactly ``tokens``: the file never becomes one
    that the next ``token new`` or ``serve --tokens`` cannot read. A TOML writer
    (tomli-w) escapes what a name holds: quotes, backslashes, emoji."""
    import tomli_w  # the [server] extra; only `token new|revoke` writes the file

    entries: dict[str, dict[str, object]] = {}
    for t in tokens:
        entry: dict[str, object] = {
            "id": t.id, "salt": t.salt.hex(), "sha256": t.sha256.hex(),
            "scopes": [str(g) for g in t.grants],
        }  # fmt: skip
        if t.expires_ms is not None:
            entry["expires"] = datetime.fromtimestamp(t.expires_ms / 1000, UTC)
        if t.rate_per_s is not None:
            entry["rate_per_s"] = t.rate_per_s
        entries[t.name] = entry
    text = "# waymark tokens (docs/security.md): secrets are stored as salted SHA-256 only.\n\n"
    text += tomli_w.dumps({"tokens": entries})
    if _parse(text, path) != tokens:
        raise TokenFileError(f"{path}: the tokens file would not read back as written")
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
