"""``waymark serve``: the /v0 HTTP API on uvicorn (uvloop + httptools)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from waymark.cli.errors import EXIT_DATA_LOSS, EXIT_REFUSED, Failure
from waymark.cli.extras import require

if TYPE_CHECKING:
    from waymark.server.config import ServerConfig


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one.")] = 8080,
        data_dir: Annotated[
            Path,
            typer.Option(
                help="Directory for durable storage (the write-ahead log). Topics are "
                "recovered from it at start-up; it is created if missing."
            ),
        ] = Path("waymark-data"),
        wal_shards: Annotated[
            int, typer.Option(help="WAL files written in parallel; a topic always uses one.")
        ] = 2,
        cold_dir: Annotated[
            Path | None,
            typer.Option(
                help="Cold tier: sealed segments older than each topic's newest "
                "--hot-segments move here at seals (another, slower disk)."
            ),
        ] = None,
        hot_segments: Annotated[
            int, typer.Option(help="Segments per topic kept in --data-dir with --cold-dir.")
        ] = 4,
        seal_interval_s: Annotated[
            float,
            typer.Option(
                help="Seconds between seals (seal the tail into segments, "
                "trim the WAL), taken only when something was written."
            ),
        ] = 10.0,
        checkpoint_interval_s: Annotated[
            float,
            typer.Option(
                help="Seconds per change checkpoint (what was committed, per key; "
                "docs/recovery.md), written only when something was committed. 0 keeps none."
            ),
        ] = 1.0,
        recovery_window_s: Annotated[
            float,
            typer.Option(
                help="Seconds change checkpoints are kept: how far back a recovery query can look."
            ),
        ] = 86_400.0,
        heartbeat_s: Annotated[
            float, typer.Option(help="Seconds of silence before an SSE heartbeat comment.")
        ] = 15.0,
        delivery_budget: Annotated[
            int,
            typer.Option(
                min=1,
                help="Delivery work (readers' wakeups, router forwarding and recovery "
                "steps) run per turn of the event loop, highest topic priority first.",
            ),
        ] = 32,
        history_interval_s: Annotated[
            float,
            typer.Option(
                min=0.05,
                help="Seconds between samples of the append-rate history the console charts "
                "(kept in memory, the last 360 samples of up to 500 topics).",
            ),
        ] = 5.0,
        ceiling_trim_s: Annotated[
            float,
            typer.Option(
                min=0.001,
                help="Seconds a topic hands out no seq before its seq ceiling is lowered to "
                "its head, so a crash while it is idle reports no gap (docs/durability.md).",
            ),
        ] = 0.05,
        clock_offset_file: Annotated[
            Path | None,
            typer.Option(
                help="Fault injection, for tests and fault campaigns: the server's clock "
                "(TTLs, leases, token expiry) is the wall clock plus the milliseconds this "
                "file holds, read again every 0.1 s, so rewriting it jumps the clock "
                "(docs/faults.md).",
            ),
        ] = None,
        tokens: Annotated[
            Path | None,
            typer.Option(
                help="Tokens file (`waymark token new`): every route but /v0/health and "
                "the OpenAPI document then needs a bearer token with its scope. "
                "Re-read on SIGHUP.",
            ),
        ] = None,
        insecure_no_auth: Annotated[
            bool, typer.Option(help="Allow a non-loopback --host without --tokens.")
        ] = False,
        open_metrics: Annotated[
            bool, typer.Option(help="Serve /metrics without a token (else it needs admin).")
        ] = False,
        tls_cert: Annotated[
            Path | None, typer.Option(help="TLS certificate chain (PEM): serve https.")
        ] = None,
        tls_key: Annotated[Path | None, typer.Option(help="TLS private key (PEM).")] = None,
        header_timeout_s: Annotated[
            float,
            typer.Option(help="Seconds a request's headers may take to arrive (408 after)."),
        ] = 10.0,
        body_timeout_s: Annotated[
            float,
            typer.Option(
                help="Seconds a request body may take, plus 1 s per 64 KiB received (408 after)."
            ),
        ] = 10.0,
        keep_alive_s: Annotated[
            float, typer.Option(help="Seconds an idle kept-alive connection stays open.")
        ] = 5.0,
        max_connections: Annotated[
            int, typer.Option(min=1, help="Open connections; more are answered 503.")
        ] = 1000,
        max_connections_per_address: Annotated[
            int,
            typer.Option(min=1, help="Open connections from one client address; more get 503."),
        ] = 256,
        audit_log: Annotated[
            Path | None,
            typer.Option(
                help="Append a JSON line per refused request and per admin action to this "
                "file (mode 0600), rotated by size (docs/security.md, Audit log).",
            ),
        ] = None,
        audit_log_max_bytes: Annotated[
            int, typer.Option(min=1, help="Rotate the audit log past this size (5 kept).")
        ] = 10 << 20,
        tls_client_ca: Annotated[
            Path | None,
            typer.Option(
                help="Require a client certificate signed by this CA (PEM) in the TLS "
                "handshake; needs --tls-cert.",
            ),
        ] = None,
        max_streams: Annotated[
            int, typer.Option(min=1, help="Open SSE streams (watch, /work); more get 429.")
        ] = 500,
        max_body_bytes: Annotated[
            int, typer.Option(min=1, help="Largest request body; larger ones get 413.")
        ] = 64 << 20,
        max_topics: Annotated[
            int, typer.Option(min=1, help="Topics the server holds; one more gets 429.")
        ] = 100_000,
        max_staged_bytes_per_writer: Annotated[
            int,
            typer.Option(min=1, help="Unpublished bytes one exactly-once writer may stage (429)."),
        ] = 256 << 20,
        max_staged_bytes: Annotated[
            int, typer.Option(min=1, help="Unpublished bytes all writers may stage (429).")
        ] = 1 << 30,
        allowed_host: Annotated[
            list[str] | None,
            typer.Option(
                help="A name of this server that requests may carry in Host (besides "
                "localhost and the loopback addresses on a loopback --host); repeatable. "
                "Others get 403: a page rebinding its DNS name to this server is refused.",
            ),
        ] = None,
        cors_origin: Annotated[
            list[str] | None,
            typer.Option(
                help="A web page origin (https://app.example) whose requests are served, "
                "with CORS headers; repeatable. Requests from other pages get 403.",
            ),
        ] = None,
    ) -> None:
        """Serve the topic log over HTTP until SIGINT or SIGTERM."""
        require("serve", "server")
        # Each flag is one field of one section (waymark.server.config, docs/architecture.md).
        from waymark.log.config import ChangesConfig, EngineConfig, StorageConfig
        from waymark.protocol import Limits
        from waymark.server.browser import BrowserPolicy
        from waymark.server.config import (
            AuthConfig,
            ConsoleConfig,
            HttpConfig,
            ServerConfig,
            StreamConfig,
        )

        config = ServerConfig(
            storage=StorageConfig(data_dir=data_dir, wal_shards=wal_shards, cold_dir=cold_dir,
                                  hot_segments=hot_segments, seal_interval_s=seal_interval_s),
            engine=EngineConfig(
                limits=Limits(max_body_bytes=max_body_bytes, max_topics=max_topics,
                              max_staged_bytes_per_writer=max_staged_bytes_per_writer,
                              max_staged_bytes=max_staged_bytes),
                ceiling_trim_s=ceiling_trim_s),
            changes=ChangesConfig(checkpoint_interval_s=checkpoint_interval_s,
                                  recovery_window_s=recovery_window_s),
            http=HttpConfig(host=host, port=port, tls_cert=tls_cert, tls_key=tls_key,
                            tls_client_ca=tls_client_ca, header_timeout_s=header_timeout_s,
                            body_timeout_s=body_timeout_s, keep_alive_s=keep_alive_s,
                            max_connections=max_connections,
                            max_connections_per_address=max_connections_per_address,
                            browser=BrowserPolicy.for_bind(host, allowed_host or [],
                                                           cors_origin or [])),
            streams=StreamConfig(heartbeat_s=heartbeat_s, max_streams=max_streams,
                                 delivery_budget=delivery_budget),
            console=ConsoleConfig(history_interval_s=history_interval_s),
            auth=AuthConfig(tokens=tokens, insecure_no_auth=insecure_no_auth,
                            open_metrics=open_metrics, audit_log=audit_log,
                            audit_log_max_bytes=audit_log_max_bytes),
        )  # fmt: skip
        # A fault injector, not configuration: it replaces the clock itself.
        _serve(config, clock_offset_file)


def _serve(config: ServerConfig, clock_offset_file: Path | None = None) -> None:
    """Check ``config``, recover its data directory and serve it until a signal
    (on a clock shifted by ``clock_offset_file``, when given: docs/faults.md)."""
    import errno
    import signal
    import ssl

    from waymark.clock import OffsetClock
    from waymark.log.storage.frames import CorruptFrame
    from waymark.log.storage.restore import open_engine
    from waymark.log.storage.segment import SegmentError
    from waymark.server import App
    from waymark.server.auth import TokenFileError, Tokens
    from waymark.server.serving import Server, listen

    http, auth, storage = config.http, config.auth, config.storage
    host = http.host
    if auth.tokens is None and not auth.insecure_no_auth and not _loopback(host):
        typer.echo(
            f"waymark: refusing to serve {host} without --tokens: anyone who can reach "
            "it could read, write and delete every topic. Make tokens with `waymark "
            "token new`, or pass --insecure-no-auth if the network is yours alone.",
            err=True,
        )
        raise typer.Exit(2)
    if (http.tls_cert is None) != (http.tls_key is None):
        typer.echo("waymark: --tls-cert and --tls-key go together", err=True)
        raise typer.Exit(2)
    if http.tls_client_ca is not None and http.tls_cert is None:
        typer.echo("waymark: --tls-client-ca needs --tls-cert and --tls-key", err=True)
        raise typer.Exit(2)
    # A SIGHUP (a tokens reload) sent while the data dir recovers would kill the
    # process by its default action: until the server handles it, it is ignored.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if auth.tokens is not None:
        try:
            Tokens.load(auth.tokens)
        except TokenFileError as exc:
            typer.echo(f"waymark: {exc}", err=True)
            raise typer.Exit(2) from exc
    if http.tls_cert is not None and http.tls_key is not None:
        try:  # before "listening on https://" is printed, not when uvicorn starts
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                http.tls_cert, http.tls_key
            )
        except (OSError, ssl.SSLError) as exc:
            typer.echo(f"waymark: cannot use --tls-cert/--tls-key: {exc}", err=True)
            raise typer.Exit(2) from exc
    if http.tls_client_ca is not None:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_verify_locations(
                http.tls_client_ca
            )
        except (OSError, ssl.SSLError) as exc:
            typer.echo(f"waymark: cannot use --tls-client-ca: {exc}", err=True)
            raise typer.Exit(2) from exc
    audit = None
    if auth.audit_log is not None:
        from waymark.server.audit import AuditLog

        try:
            audit = AuditLog(auth.audit_log, max_bytes=auth.audit_log_max_bytes)
        except OSError as exc:
            typer.echo(f"waymark: cannot open --audit-log: {exc}", err=True)
            raise typer.Exit(2) from exc
    try:
        engine, store, report = open_engine(
            storage,
            config.engine,
            track_changes=config.changes.tracked,
            clock=None if clock_offset_file is None else OffsetClock(clock_offset_file),
        )
    except (CorruptFrame, SegmentError) as exc:
        typer.echo(f"waymark: cannot recover {storage.data_dir}: {exc}", err=True)
        raise typer.Exit(EXIT_DATA_LOSS) from exc  # damaged data (docs/cli.md)
    torn = f", cut a torn tail of {report.torn_bytes} bytes" if report.torn_bytes else ""
    topics = report.deferred_topics
    deferred = (
        f"; {report.deferred_frames} frames of {topics} memory "
        f"topic{'s' if topics > 1 else ''} recover in the background"
        if topics
        else ""
    )
    typer.echo(
        f"waymark recovered {report.topics} topics from {report.segments} segments and "
        f"{report.frames} WAL frames "
        f"in {report.seconds:.2f}s{torn}{deferred}",
        err=True,  # stdout's first line is the listening URL, which callers wait for
    )
    try:
        sock = listen(host, http.port)
    except OSError as exc:
        engine.close()
        store.close()
        if exc.errno != errno.EADDRINUSE:
            raise  # waymark.cli.errors explains the others it knows
        raise Failure(
            f"cannot listen on {host}:{http.port}: address already in use — another process "
            "listens there; pick another --port (0: any free one)",
            EXIT_REFUSED,
        ) from exc
    app = App(config, engine=engine, store=store, audit=audit)
    server = Server(app)
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if http.tls_cert is not None else "http"
    # Printed once the socket is bound, so a parent process can wait for this line.
    typer.echo(f"waymark listening on {scheme}://{shown}:{sock.getsockname()[1]}")
    try:
        server.run(sockets=[sock])
    finally:
        if store.wal.writer_failures():
            # Memory holds writes the WAL refused: nothing more is written, the restart
            # recovers what the WAL stored (docs/durability.md, "A failed WAL writer").
            typer.echo("waymark: a WAL writer failed; stopping without the last seal", err=True)
        else:
            engine.close()  # exact heads, so a clean restart continues seqs without a gap
            store.seal(engine)  # and a short WAL to replay
        store.close()
    typer.echo("waymark stopped")


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere
