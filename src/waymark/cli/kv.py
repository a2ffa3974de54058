"""``waymark kv put|get|watch``: a fold bucket's keys from the shell (docs/kv.md, "Keys
from the shell"), in the habits of ``nats kv``.

The bucket is a NATS JetStream KV bucket, the one ``waymark fold --bucket`` folds.
``put`` creates a missing bucket (as ``waymark fold`` does); ``get`` and ``watch`` never
do: a missing bucket is exit 4 (not found), like a missing key. NATS is imported inside
the commands, so ``--help`` stays fast (docs/cli.md, "Start-up").
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from waymark.cli.connect import Json
from waymark.cli.errors import EXIT_NOT_FOUND, Failure
from waymark.cli.extras import require

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from waymark.kv import Connection, KvStore

# NATS KV keys: these characters, dot-separated tokens, no empty token at either end.
_KEY = re.compile(r"[-/_=.A-Za-z0-9]+")

Bucket = Annotated[str, typer.Argument(help="The KV bucket.", show_default=False)]
Key = Annotated[str, typer.Argument(help="The key, e.g. routes.eu-1.", show_default=False)]
NatsUrl = Annotated[
    str,
    typer.Option(
        "--nats", envvar="NATS_URL", show_envvar=True, help="The NATS server (JetStream)."
    ),
]
Creds = Annotated[str | None, typer.Option(help="Path to a NATS .creds file.")]
Timeout = Annotated[
    float, typer.Option(min=0.1, help="Seconds each NATS call (connecting too) may take.")
]
DEFAULT_NATS = "nats://127.0.0.1:4222"


def _check_key(key: str, *, param: str = "KEY") -> str:
    if not _KEY.fullmatch(key) or key.startswith(".") or key.endswith(".") or ".." in key:
        raise typer.BadParameter(
            f"{key!r} is not a NATS KV key: letters, digits and -/_=. only, "
            "dot-separated tokens, none empty",
            param_hint=param,
        )
    return key


def _run(
    nats: str, creds: str | None, timeout: float, bucket: str, create: bool,
    body: Callable[[KvStore], Awaitable[Any]],
) -> Any:  # fmt: skip
    """Connect, open ``bucket`` and run ``body`` on it; Ctrl-C ends it quietly."""
    import asyncio

    from waymark.kv import Connection, NatsConnectionConfig

    async def main() -> Any:
        config = NatsConnectionConfig(url=nats, creds_file=creds, timeout=timeout)
        conn: Connection
        async with Connection(config) as conn:
            return await body(await conn.store(bucket, create=create))

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _entry(key: str, value: bytes, version: int | None, op: str | None = None) -> dict[str, Any]:
    """A key's JSON form, as ``waymark fold show`` prints it: the value as text when it
    is UTF-8, else base64 with ``"encoding": "base64"``."""
    import base64

    line: dict[str, Any] = {"key": key} if op is None else {"op": op, "key": key}
    try:
        line["value"] = value.decode()
    except UnicodeDecodeError:
        line["value"] = base64.b64encode(value).decode()
        line["encoding"] = "base64"
    line["version"] = version
    return line


def _print_json(value: Any) -> None:
    import json

    sys.stdout.write(json.dumps(value, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    kv = typer.Typer(
        help="KV buckets (the ones `waymark fold` folds): put, get and watch keys.",
        no_args_is_help=True,
    )
    app.add_typer(kv, name="kv")

    @kv.command()
    def put(
        bucket: Bucket,
        key: Key,
        value: Annotated[
            str | None,
            typer.Argument(help="The value; none or - reads it from stdin.", show_default=False),
        ] = None,
        nats: NatsUrl = DEFAULT_NATS,
        creds: Creds = None,
        timeout: Timeout = 10.0,
        json: Json = False,
    ) -> None:
        """Set KEY to VALUE in BUCKET (created if missing); prints the new revision."""
        require("kv", "kv")
        _check_key(key)
        data = sys.stdin.buffer.read() if value in (None, "-") else str(value).encode()

        async def body(store: KvStore) -> int | None:
            return (await store.writer().put(key, data)).as_u64()

        revision = _run(nats, creds, timeout, bucket, True, body)
        if json:
            _print_json({"bucket": bucket, "key": key, "version": revision})
        else:
            typer.echo(f"put {key} in {bucket}: revision {revision}", err=True)

    @kv.command()
    def get(
        bucket: Bucket,
        key: Key,
        nats: NatsUrl = DEFAULT_NATS,
        creds: Creds = None,
        timeout: Timeout = 10.0,
        json: Json = False,
    ) -> None:
        """Print KEY's value as stored (bytes, no newline added); --json: key, value,
        version. A missing key or bucket exits 4 (not found)."""
        require("kv", "kv")
        _check_key(key)

        async def body(store: KvStore) -> tuple[bytes, int | None] | None:
            entry = await store.reader().get(key)  # a deleted key is not found
            return None if entry is None else (entry.value, entry.version.as_u64())

        found = _run(nats, creds, timeout, bucket, False, body)
        if found is None:
            raise Failure(f"not found: no key {key} in bucket {bucket}", EXIT_NOT_FOUND)
        data, version = found
        if json:
            _print_json(_entry(key, data, version))
            return
        sys.stdout.buffer.write(data)
        sys.stdout.flush()

    @kv.command()
    def watch(
        bucket: Bucket,
        prefix: Annotated[
            list[str] | None,
            typer.Option(help="Only keys under this prefix (repeatable); '.' is appended."),
        ] = None,
        count: Annotated[
            int | None, typer.Option("-n", "--count", min=1, help="Exit after N updates.")
        ] = None,
        nats: NatsUrl = DEFAULT_NATS,
        creds: Creds = None,
        timeout: Timeout = 10.0,
        json: Json = False,
    ) -> None:
        """Print every key's current value, then each change as it happens, until
        Ctrl-C: one line per update, ``PUT|DEL|PURGE<TAB>key<TAB>revision<TAB>value``;
        --json: one JSON object per line."""
        require("kv", "kv")
        scopes = tuple(p if p.endswith(".") else p + "." for p in prefix or [])
        for p in scopes:
            _check_key(p[:-1], param="--prefix")

        async def body(store: KvStore) -> None:
            from waymark.kv import Op, WatchScope

            names = {Op.PUT: "PUT", Op.DELETE: "DEL", Op.PURGE: "PURGE"}
            seen = 0
            async with await store.watcher().watch(WatchScope.of(scopes)) as updates:
                async for update in updates.updates():
                    version = update.version.as_u64()
                    if json:
                        _print_json(_entry(update.key, update.value, version, names[update.op]))
                    else:
                        line = f"{names[update.op]}\t{update.key}\t{version}\t".encode()
                        sys.stdout.buffer.write(line + update.value + b"\n")
                        sys.stdout.flush()
                    seen += 1
                    if count is not None and seen >= count:
                        return

        _run(nats, creds, timeout, bucket, False, body)
