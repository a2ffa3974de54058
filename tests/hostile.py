"""Hostile clients against a real ``waymark serve`` over TLS, while a checker appends
with fsync and a prober asks /v0/health (docs/security.md, "Hostile clients").

Shared by ``tests/server/test_hostile.py`` (small scale, in the normal suite) and
``bench/hostile.py`` (the figures, as a table). Every attack runs from the client
addresses 127.0.1.x; the checker and the prober run in a child process from 127.0.0.2,
so the per-address connection limit that holds the attackers back does not hold them,
and the attackers' own CPU does not delay their measurements.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import ssl
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waymark.server.auth import new_token

CHECKED = "checked"  # the checker's fsync topic
# A slow client is held until the server cuts it, for at most the attack's seconds and
# this much more: a TLS handshake of a crowd of connections may itself take up to the
# header timeout before the header timer starts.
GRACE_S = 5.0
FEED = "hostile.feed"  # what the SSE streams watch
PROBER_ADDRESS = "127.0.0.2"
ATTACKER_ADDRESSES = 16  # 127.0.1.0 .. 127.0.1.15


def attacker_address(i: int) -> str:
    return f"127.0.1.{i % ATTACKER_ADDRESSES}"


@dataclass
class Target:
    """A running server and what a client needs to reach it."""

    url: str
    host: str
    port: int
    ca_file: str
    checker_token: str
    attacker_token: str
    process: subprocess.Popen[str]
    args: list[str]

    def ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)

    def metric(self, name: str) -> float:
        with httpx.Client(verify=self.ssl(), timeout=10) as http:
            for line in http.get(f"{self.url}/metrics").text.splitlines():
                if line.split(" ")[0] == name:
                    return float(line.split()[-1])
        return 0.0


def start(directory: Path, *extra: str, port: int = 0) -> Target:
    """``waymark serve`` over TLS with the tokens and certificates :func:`prepare` made."""
    tokens, ca_file = directory / "tokens.toml", directory / "ca.pem"
    chain, key = directory / "chain.pem", directory / "key.pem"
    secrets = {name: (directory / f"{name}.secret").read_text() for name in ("checker", "attacker")}
    args = [str(Path(sys.executable).parent / "waymark"), "serve", "--port", str(port),
            "--data-dir", str(directory / "data"), "--tokens", str(tokens),
            "--tls-cert", str(chain), "--tls-key", str(key), "--open-metrics", *extra]  # fmt: skip
    # Its log: no hostile request may make the server log a traceback or a warning.
    with (directory / "server.log").open("a") as log:
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    url = line.split("listening on ")[1].strip()
    host, port_text = url.removeprefix("https://").rsplit(":", 1)
    target = Target(url, host, int(port_text), str(ca_file), secrets["checker"],
                    secrets["attacker"], process, args)  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            with httpx.Client(verify=target.ssl(), timeout=5) as http:
                if http.get(f"{url}/v0/health").status_code == 200:
                    return target
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.05)


def prepare(directory: Path) -> None:
    """Make the certificates and tokens once (the secrets kept next to the file)."""
    directory.mkdir(parents=True, exist_ok=True)
    tokens, ca_file = directory / "tokens.toml", directory / "ca.pem"
    chain, key = directory / "chain.pem", directory / "key.pem"
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(key))
    for i, blob in enumerate(cert.cert_chain_pems):
        blob.write_to_path(str(chain), append=i > 0)
    checker = new_token(tokens, "checker", [f"write:{CHECKED}", f"read:{CHECKED}", "admin"])
    attacker = new_token(tokens, "attacker", ["read:*", "write:hostile.*"])
    (directory / "checker.secret").write_text(checker)
    (directory / "attacker.secret").write_text(attacker)


def restart(target: Target) -> Target:
    """SIGKILL the server and start it again on the same data directory and port."""
    target.process.send_signal(signal.SIGKILL)
    target.process.wait()
    directory = Path(target.args[target.args.index("--tokens") + 1]).parent
    extra = target.args[target.args.index("--open-metrics") + 1 :]
    return start(directory, *extra, port=target.port)


# --- the checker and the prober: a child process ---------------------------------------


def _watch_over(url: str, ca_file: str, token: str, commands: Connection) -> None:
    """Child process: append to the fsync topic and probe /v0/health until told to
    stop; then send back what each phase measured and every acknowledged record."""
    phase = ["idle"]
    stop = threading.Event()
    probes: dict[str, list[float]] = {}
    failed_probes: dict[str, int] = {}
    acked: list[tuple[int, int]] = []  # (seq, n)
    unacked = [0]
    tls = ssl.create_default_context(cafile=ca_file)

    def client() -> httpx.Client:
        transport = httpx.HTTPTransport(verify=tls, local_address=PROBER_ADDRESS)
        return httpx.Client(base_url=url, transport=transport, timeout=10,
                            headers={"authorization": f"Bearer {token}"})  # fmt: skip

    def probe() -> None:
        with client() as http:
            while not stop.is_set():
                name, started = phase[0], time.perf_counter()
                try:
                    ok = http.get("/v0/health").status_code == 200
                except httpx.TransportError:
                    ok = False
                if ok:
                    probes.setdefault(name, []).append(time.perf_counter() - started)
                else:
                    failed_probes[name] = failed_probes.get(name, 0) + 1
                    time.sleep(0.05)
                time.sleep(0.01)

    def check() -> None:
        n = 0
        with client() as http:
            while not stop.is_set():
                batch = [{"data": {"n": n + i}} for i in range(5)]
                try:
                    answer = http.post(f"/v0/topics/{CHECKED}/records", json={"records": batch})
                except httpx.TransportError:
                    answer = None
                if answer is not None and answer.status_code == 200:
                    acked.extend(zip(answer.json()["seqs"], range(n, n + 5), strict=True))
                else:
                    unacked[0] += 1
                    time.sleep(0.05)
                n += 5

    threads = [threading.Thread(target=probe), threading.Thread(target=check)]
    for thread in threads:
        thread.start()
    while True:
        command = commands.recv()
        if command[0] == "phase":
            phase[0] = command[1]
            commands.send("ok")
        else:
            break
    stop.set()
    for thread in threads:
        thread.join()
    commands.send({"probes": probes, "failed_probes": failed_probes, "acked": acked,
                   "unacked": unacked[0]})  # fmt: skip


@dataclass
class Watch:
    """The checker and prober child; ``phase`` labels what they measure next."""

    commands: Connection
    process: multiprocessing.process.BaseProcess

    @classmethod
    def start(cls, target: Target) -> Watch:
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(target=_watch_over,
                                  args=(target.url, target.ca_file, target.checker_token,
                                        theirs))  # fmt: skip
        process.start()
        return cls(ours, process)

    def phase(self, name: str) -> None:
        self.commands.send(("phase", name))
        assert self.commands.recv() == "ok"

    def stop(self) -> dict[str, Any]:
        self.commands.send(("stop",))
        result = self.commands.recv()
        self.process.join(30)
        return result


def create_checked(target: Target) -> None:
    headers = {"authorization": f"Bearer {target.checker_token}"}
    with httpx.Client(verify=target.ssl(), headers=headers, timeout=10) as http:
        answer = http.put(f"{target.url}/v0/topics/{CHECKED}", json={"durability": "fsync"})
        assert answer.status_code in (200, 201), answer.text


def lost_records(target: Target, acked: list[tuple[int, int]]) -> list[int]:
    """The acknowledged seqs whose record is missing or not as written."""
    stored: dict[int, Any] = {}
    headers = {"authorization": f"Bearer {target.checker_token}"}
    with httpx.Client(base_url=target.url, verify=target.ssl(), headers=headers,
                      timeout=30) as http:  # fmt: skip
        cursor = 0
        while True:
            page = http.post(f"/v0/topics/{CHECKED}/diff",
                             json={"from_seq": cursor, "limit": 10_000}).json()  # fmt: skip
            for record in page["records"]:
                stored[record["$seq"]] = record["data"]
            if page["next_from_seq"] == cursor or not page["records"]:
                break
            cursor = page["next_from_seq"]
    return [seq for seq, n in acked if stored.get(seq) != {"n": n}]


# --- the attacks -------------------------------------------------------------------------


@dataclass
class Tally:
    """What one attack did and what the server answered it."""

    tried: int = 0  # connections opened or requests sent
    cut: int = 0  # ended by the server (a refusal, a close)
    answers: dict[str, int] = field(default_factory=dict)  # status line -> count
    server_errors: int = 0  # 5xx answers: must stay 0 (503 server_busy excepted)
    notes: list[str] = field(default_factory=list)

    def closed(self, how: str) -> None:
        """Cut without an answer to read: ``reset`` (the server closed while the client
        was still sending, which can discard its answer), or ``handshake cut`` (a TLS
        handshake the server did not finish within the header timeout: under a burst
        of hundreds at once on a loaded machine, honest ones too)."""
        self.cut += 1
        self.answers[how] = self.answers.get(how, 0) + 1

    def answered(self, head: bytes) -> None:
        status = head[9:12].decode("latin-1") if head.startswith(b"HTTP/1.1 ") else "none"
        self.answers[status] = self.answers.get(status, 0) + 1
        if status.startswith("5") and b"server_busy" not in head:
            self.server_errors += 1


async def _connect(target: Target, i: int, tls: bool = True) -> tuple[Any, Any]:
    return await asyncio.open_connection(
        target.host, target.port, ssl=target.ssl() if tls else None,
        server_hostname=target.host if tls else None, local_addr=(attacker_address(i), 0),
    )  # fmt: skip


async def _read_until_closed(reader: asyncio.StreamReader, seconds: float) -> bytes:
    answer = b""
    with contextlib.suppress(TimeoutError, ConnectionError, ssl.SSLError):
        async with asyncio.timeout(seconds):
            while chunk := await reader.read(65536):
                answer += chunk
    return answer


async def slow_headers(target: Target, n: int, seconds: float) -> Tally:
    """Slowloris: a request line, then a header byte every 200 ms, never the end; held
    until the server cuts it (at most ``seconds`` + ``GRACE_S``)."""
    tally = Tally()

    async def one(i: int) -> None:
        tally.tried += 1
        try:
            reader, writer = await _connect(target, i)
        except (OSError, ssl.SSLError):
            tally.closed("handshake cut")
            return
        writer.write(b"GET /v0/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        deadline = time.monotonic() + seconds + GRACE_S
        answer = b""
        try:
            while time.monotonic() < deadline and not reader.at_eof():
                writer.write(b"x")
                await writer.drain()
                answer += await _read_until_closed(reader, 0.2)
                if answer or reader.at_eof():
                    break
        except (ConnectionError, ssl.SSLError):
            tally.closed("reset")
            return
        if answer or reader.at_eof():
            tally.cut += 1
            tally.answered(answer)
        writer.close()

    await asyncio.gather(*(one(i) for i in range(n)))
    return tally


async def slow_bodies(target: Target, n: int, seconds: float) -> Tally:
    """A body declared 100 kB, then a byte every 300 ms; held until the server cuts it
    (at most ``seconds`` + ``GRACE_S``)."""
    tally = Tally()

    async def one(i: int) -> None:
        tally.tried += 1
        try:
            reader, writer = await _connect(target, i)
        except (OSError, ssl.SSLError):
            tally.closed("handshake cut")
            return
        writer.write(
            b"POST /v0/topics/hostile.slow/records HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + target.attacker_token.encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
        )
        deadline = time.monotonic() + seconds + GRACE_S
        answer = b""
        try:
            while time.monotonic() < deadline and not answer and not reader.at_eof():
                writer.write(b" ")
                await writer.drain()
                answer += await _read_until_closed(reader, 0.3)
        except (ConnectionError, ssl.SSLError):
            tally.closed("reset")
            return
        if answer or reader.at_eof():
            tally.cut += 1
            tally.answered(answer)
        writer.close()

    await asyncio.gather(*(one(i) for i in range(n)))
    return tally


async def slow_tls(target: Target, n: int, seconds: float) -> Tally:
    """TCP connections that never finish the TLS handshake: half say nothing, half send
    the start of a ClientHello and stop."""
    tally = Tally()

    async def one(i: int) -> None:
        try:
            reader, writer = await _connect(target, i, tls=False)
        except OSError:
            return
        tally.tried += 1
        if i % 2:
            writer.write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        answer = await _read_until_closed(reader, seconds + GRACE_S)
        if reader.at_eof() or answer:
            tally.cut += 1
        writer.close()

    await asyncio.gather(*(one(i) for i in range(n)))
    return tally


async def upgrade_flood(target: Target, n: int, seconds: float) -> Tally:
    """Requests to upgrade to WebSocket, 20 at a time; each must be refused and closed,
    and leave no connection counted (it once leaked one slot each). Each waits up to
    30 s for the server to answer and close: the server is judged on what it does, not
    on how fast a loaded machine runs it (at 5 s, 18 of 160 in a loaded CI run read
    nothing yet)."""
    tally = Tally()
    before = await asyncio.to_thread(target.metric, "waymark_connections")
    gate = asyncio.Semaphore(20)

    async def one(i: int) -> None:
        async with gate:
            try:
                reader, writer = await _connect(target, i)
            except (OSError, ssl.SSLError):
                return
            tally.tried += 1
            writer.write(b"GET /v0/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
                         b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                         b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")  # fmt: skip
            answer = await _read_until_closed(reader, 30)
            tally.answered(answer)
            if answer.startswith(b"HTTP/1.1 400") and reader.at_eof():
                tally.cut += 1
            writer.close()

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
    deadline = time.monotonic() + 10
    while (after := await asyncio.to_thread(target.metric, "waymark_connections")) > before + 5:
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    tally.notes.append(f"connections {before:.0f} before, {after:.0f} after")
    if after > before + 5:
        tally.server_errors += 1  # a leak
    return tally


async def sse_streams(target: Target, n: int, seconds: float) -> Tally:
    """``n`` watch streams held open together for ``seconds`` while the checker
    appends to the topic they watch; every stream must keep receiving. They connect
    20 at a time: 100 TLS handshakes at once took a loaded 2-core machine past the
    handshake time limit (the header timeout, 1 s in the test)."""
    tally = Tally()
    received = [0] * n
    failures: dict[str, int] = {}
    # From the head: live streams, each sent every append the checker makes from now on
    # (from 0 each would first replay the whole topic, a read load of its own).
    since = await asyncio.to_thread(_head, target, CHECKED)
    gate = asyncio.Semaphore(20)
    opened = asyncio.Event()
    ready = [0]

    async def one(i: int) -> None:
        async with gate:
            try:
                reader, writer = await _connect(target, i)
                writer.write(
                    f"GET /v0/topics/{CHECKED}/watch?from_seq={since} HTTP/1.1\r\n"
                    f"Host: 127.0.0.1\r\n"
                    f"Authorization: Bearer {target.attacker_token}\r\n\r\n".encode()
                )
                async with asyncio.timeout(30):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError) as exc:
                kind = type(exc).__name__
                failures[kind] = failures.get(kind, 0) + 1
                return
        tally.tried += 1
        tally.answered(head)
        ready[0] += 1
        if ready[0] + sum(failures.values()) == n:
            opened.set()
        await opened.wait()  # all open: now they are held together
        deadline = time.monotonic() + seconds
        with contextlib.suppress(TimeoutError, ConnectionError, ssl.SSLError):
            while time.monotonic() < deadline:
                async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
                    chunk = await reader.read(65536)
                if not chunk:
                    break
                received[i] += chunk.count(b"\ndata:") + chunk.startswith(b"data:")
        writer.close()

    async def watchdog() -> None:  # streams that failed to open do not hold the rest
        while ready[0] + sum(failures.values()) < n:
            await asyncio.sleep(0.05)
        opened.set()

    await asyncio.gather(watchdog(), *(one(i) for i in range(n)))
    tally.cut = sum(1 for r in received if r == 0)  # streams that saw nothing
    tally.notes.append(f"{sum(1 for r in received if r)} of {n} streams received events, "
                       f"{sum(received)} events in all")  # fmt: skip
    if failures:
        tally.notes.append(f"not opened: {failures}")
    return tally


def _head(target: Target, topic: str) -> int:
    headers = {"authorization": f"Bearer {target.attacker_token}"}
    with httpx.Client(verify=target.ssl(), headers=headers, timeout=10) as http:
        return int(http.get(f"{target.url}/v0/topics/{topic}").json()["head_seq"])


def _json_bodies() -> st.SearchStrategy[bytes]:
    """Append bodies a reader could not decode: every one must be refused 4xx."""
    depth = st.integers(min_value=2_000, max_value=200_000)
    deep = depth.map(lambda d: b'{"records":[{"data":' + b"[" * d + b"]" * d + b"}]}")
    bad_utf8 = st.binary(min_size=1, max_size=8).filter(_not_utf8)
    where = st.sampled_from([b'{"records":[{"data":"%b"}]}', b'{"records":[{"data":1,"tag":"%b"}]}',
                             b'{"records":[{"data":1,"meta":{"k":"%b"}}]}'])  # fmt: skip
    invalid = st.tuples(where, bad_utf8).map(lambda p: p[0] % p[1])
    numbers = st.sampled_from([b"1e400", b"-1e400", b"1e999999", b"NaN", b"Infinity",
                               b"-Infinity", b"9" * 400, b"-" + b"1" * 100_000,
                               b"0.1e310"])  # fmt: skip
    nonfinite = numbers.map(lambda x: b'{"records":[{"data":{"x":%b}}]}' % x)
    surrogate = st.sampled_from([b"\\ud800", b"\\udfff", b"a\\ud83d"]).map(
        lambda s: b'{"records":[{"data":"%b"}]}' % s)  # fmt: skip
    truncated = st.integers(min_value=1, max_value=30).map(
        lambda k: b'{"records":[{"data":{"a":[1,2,{"b":"c"}]}}]}'[:-k])  # fmt: skip
    return st.one_of(deep, invalid, nonfinite, surrogate, truncated)


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return True
    return False


def bad_bodies(target: Target, examples: int, tally: Tally) -> None:
    """Hypothesis-generated hostile append bodies (deep, invalid UTF-8, non-finite
    numbers, lone surrogates, cut short) and oversized ones: each is refused with a
    4xx and an error code, none is a 5xx, and nothing of them is stored."""
    transport = httpx.HTTPTransport(verify=target.ssl(), local_address=attacker_address(0))
    headers = {"authorization": f"Bearer {target.attacker_token}",
               "content-type": "application/json"}  # fmt: skip
    with httpx.Client(base_url=target.url, transport=transport, headers=headers,
                      timeout=30) as http:  # fmt: skip

        @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(body=_json_bodies())
        def refused(body: bytes) -> None:
            answer = http.post("/v0/topics/hostile.bodies/records", content=body)
            tally.tried += 1
            tally.answered(b"HTTP/1.1 %d" % answer.status_code)
            assert 400 <= answer.status_code < 500, (answer.status_code, body[:100])
            assert answer.json()["error"]["code"]

        refused()
        # Larger than --max-body-bytes: refused from Content-Length, before the body.
        for _ in range(3):
            answer = http.post("/v0/topics/hostile.bodies/records",
                               content=b"[" + b" " * (65 << 20) + b"]")  # fmt: skip
            tally.tried += 1
            tally.answered(b"HTTP/1.1 %d" % answer.status_code)
        stored = http.get("/v0/topics/hostile.bodies")
        assert stored.status_code == 404, stored.text  # never created: nothing stored


async def large_append(target: Target, megabytes: int) -> Tally:
    """One legal append of ``megabytes`` MB (10 000 records): other clients go on."""
    tally = Tally()
    size = megabytes * 1_000_000 // 10_000 - 40
    record = b'{"data":{"k":"%b"}}' % (b"x" * size)
    body = b'{"records":[' + b",".join([record] * 10_000) + b"]}"
    transport = httpx.AsyncHTTPTransport(verify=target.ssl(), local_address=attacker_address(1))
    headers = {"authorization": f"Bearer {target.attacker_token}"}
    async with httpx.AsyncClient(base_url=target.url, transport=transport, headers=headers,
                                 timeout=120) as http:  # fmt: skip
        # Sent 1 MiB at a time, as a client streaming from a file does: given the body
        # whole, the TLS layer encrypted all 50 MB before the first byte left, which on
        # a loaded machine took longer than the 2 s body timeout bench/hostile.py sets.
        async def pieces() -> AsyncIterator[bytes]:
            for at in range(0, len(body), 1 << 20):
                yield body[at : at + (1 << 20)]

        answer = await http.post("/v0/topics/hostile.large/records", content=pieces(),
                                 headers={"content-type": "application/json",
                                          "content-length": str(len(body))})  # fmt: skip
    tally.tried = 1
    tally.answered(b"HTTP/1.1 %d" % answer.status_code)
    note = f"{len(body) / 1e6:.0f} MB answered {answer.status_code}"
    if answer.status_code != 200:  # which limit refused it, and after how much
        note += f" {answer.text[:300]}"
    tally.notes.append(note)
    return tally


# --- one run -----------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    run: Callable[[Target], Awaitable[Tally]]


@dataclass
class Report:
    phases: list[tuple[str, Tally]]
    probes: dict[str, list[float]]
    failed_probes: dict[str, int]
    acked: int
    unacked: int
    lost: list[int]
    kills: int
    log_errors: list[str]  # tracebacks and warnings the server logged

    def p(self, name: str, q: float) -> float:
        latencies = sorted(self.probes.get(name, []))
        if not latencies:
            return float("nan")
        return latencies[min(len(latencies) - 1, int(len(latencies) * q))]

    def median(self, name: str) -> float:
        return statistics.median(self.probes.get(name, [float("nan")]))


def run(directory: Path, phases: list[Phase], *, idle_s: float, kills: int = 0,
        extra: tuple[str, ...] = ()) -> Report:  # fmt: skip
    """Start the server, the checker and the prober; run each phase; SIGKILL and restart
    the server ``kills`` times at the end; verify every acknowledged record."""
    prepare(directory)
    target = start(directory, *extra)
    create_checked(target)
    watch = Watch.start(target)
    done: list[tuple[str, Tally]] = []
    try:
        watch.phase("idle")
        time.sleep(idle_s)
        for phase in phases:
            watch.phase(phase.name)
            done.append((phase.name, asyncio.run(phase.run(target))))
            watch.phase("between")
            assert target.process.poll() is None, f"the server died under {phase.name}"
        for _ in range(kills):
            watch.phase("restart")
            target = restart(target)
            watch.phase("after restart")
            time.sleep(idle_s)
    finally:
        result = watch.stop()
    try:
        lost = lost_records(target, result["acked"])
    finally:
        target.process.send_signal(signal.SIGTERM)
        try:
            target.process.wait(15)
        except subprocess.TimeoutExpired:
            target.process.kill()
    noise = ("Traceback", "Fatal error", "WARNING", "ERROR")
    log = (directory / "server.log").read_text(errors="replace").splitlines()
    log_errors = [line for line in log if line.startswith(noise)]
    return Report(done, result["probes"], result["failed_probes"], len(result["acked"]),
                  result["unacked"], lost, kills, log_errors)  # fmt: skip


def phases(*, connections: int, streams: int, examples: int, seconds: float,
           append_mb: int) -> list[Phase]:  # fmt: skip
    """Every attack, at this scale."""

    async def bodies(target: Target) -> Tally:
        tally = Tally()
        await asyncio.to_thread(bad_bodies, target, examples, tally)
        return tally

    return [
        Phase("slow headers", lambda t: slow_headers(t, connections, seconds)),
        Phase("slow bodies", lambda t: slow_bodies(t, connections, seconds)),
        Phase("slow TLS handshakes", lambda t: slow_tls(t, connections, seconds)),
        Phase("upgrade flood", lambda t: upgrade_flood(t, connections * 4, seconds)),
        Phase("bad bodies", bodies),
        Phase(f"{append_mb} MB append", lambda t: large_append(t, append_mb)),
        Phase(f"{streams} SSE streams", lambda t: sse_streams(t, streams, seconds)),
    ]
