"""What one open web console costs the server (docs/console.md).

A console tab polls the API every 2 s: the Topics page ``GET /v0/topics``, a topic page
``GET /v0/topics/{t}?touch=false``, the Queues page the list again; it loads its files
once; the Folds and Recovery pages poll ``GET /v0/folds`` and
``GET /v0/recovery/clients``, and each fold node or recovery client sends a report
every few seconds (``--folds`` nodes and ``--clients`` clients report once here). This
measures, on one ``waymark serve`` started here with ``--topics`` topics and
a queue holding ``--leases`` leases in flight, the latency of each of those requests
over one keep-alive connection, beside the anchor in the same run: ``GET /v0/health``,
the cheapest route the server has. It also prints what one tab's polling costs the
server per second (its requests' time / 2 s).

Run: ``.venv/bin/python bench/console.py [--topics 1000] [--leases 10000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

POLL_S = 2.0  # the console's polling interval


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


class KeepAlive:
    """A minimal keep-alive HTTP/1.1 GET client (Content-Length answers only), so the
    figures are the server's and not a heavy client's."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host = host
        self.sock = socket.create_connection((host, int(port)))
        self.file = self.sock.makefile("rb")

    def get(self, path: str, body: bytes | None = None) -> bytes:
        """GET ``path``, or POST ``body`` (JSON) to it."""
        if body is None:
            request = b"GET %s HTTP/1.1\r\nhost: %s\r\n\r\n" % (path.encode(), self.host.encode())
        else:
            request = (b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
                       b"content-length: %d\r\n\r\n%s"
                       % (path.encode(), self.host.encode(), len(body), body))  # fmt: skip
        self.sock.sendall(request)
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += self.file.readline()
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
        return self.file.read(length)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def timed(
    client: KeepAlive, path: str, seconds: float, body: bytes | None = None
) -> tuple[float, int]:
    """Mean seconds per request over about ``seconds``, and the answer's size."""
    size = len(client.get(path, body))  # warm
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        client.get(path, body)
        count += 1
    return elapsed / count, size


def fold_report(i: int, cursor: int = 1000) -> bytes:
    fold = f"fold{i // 3:03d}"
    export = {"cursor": cursor - 10, "time_ms": 1_700_000_000_000,
              "payload": f"{fold}.payloads/5725ce14129a2dce.tar"}  # fmt: skip
    return json.dumps({"fold": fold, "node": f"node{i % 3}", "backend": "lmdb",
                       "bucket": f"b{i // 3:03d}", "cursor": cursor,
                       "bucket_seq": cursor + i % 7, "export": export}).encode()  # fmt: skip


def fill(url: str, topics: int, leases: int, folds: int, clients: int) -> None:
    with httpx.Client(base_url=url, timeout=120) as http:
        for i in range(folds):
            http.post(
                "/v0/folds", content=fold_report(i), headers={"content-type": "application/json"}
            ).raise_for_status()
        for i in range(clients):
            http.post("/v0/recovery/clients", json={"client": f"c{i:04d}", "watermark": i,
                      "range_receipts": 3, "pending": 1}).raise_for_status()  # fmt: skip
        for i in range(topics):
            http.post(f"/v0/topics/t{i:05d}/records",
                      json={"records": [{"data": {"n": n}} for n in range(10)]})  # fmt: skip
        http.put("/v0/topics/jobs", json={"type": "queue", "lease_ms": 600_000})
        for start in range(0, leases, 5000):
            batch = [{"data": {"job": j}} for j in range(start, min(leases, start + 5000))]
            http.post("/v0/topics/jobs/records", json={"records": batch}).raise_for_status()
        for worker in range(0, leases, 1000):
            http.post("/v0/topics/jobs/claim", json={"node": f"w{worker}", "max": 1000})
        # Half of them acked: the expiry heap's top then holds superseded entries.
        claimed = http.post("/v0/topics/jobs/diff", json={"from_seq": 0, "limit": 10000}).json()
        seqs = [r["$seq"] for r in claimed["records"]][: leases // 2]
        by_node: dict[str, list[int]] = {}
        for seq in seqs:
            by_node.setdefault(f"w{(seq - 1) // 1000 * 1000}", []).append(seq)
        for node, held in by_node.items():
            http.post("/v0/topics/jobs/ack", json={"node": node, "seqs": held})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--folds", type=int, default=300, help="fold nodes reporting")
    parser.add_argument("--clients", type=int, default=300, help="recovery clients reporting")
    parser.add_argument("--seconds", type=float, default=1.5, help="per row")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as data:
        exe = str(Path(sys.executable).parent / "waymark")
        command = [exe, "serve", "--port", "0", "--data-dir", data]
        server = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        try:
            assert server.stdout is not None
            url = server.stdout.readline().split("waymark listening on ")[1].split()[0]
            fill(url, args.topics, args.leases, args.folds, args.clients)
            client = KeepAlive(url)
            rows = [
                ("anchor: GET /v0/health", "/v0/health"),
                ("GET /ui/ (the page)", "/ui/"),
                ("GET /ui/topic.js (largest module)", "/ui/topic.js"),
                (f"GET /v0/topics ({args.topics + 1:,} topics)", "/v0/topics"),
                ("GET a log topic's state", "/v0/topics/t00000?touch=false"),
                (f"GET a queue's state ({args.leases // 2:,} leases)",
                 "/v0/topics/jobs?touch=false"),
                (f"GET /v0/folds ({args.folds:,} fold nodes)", "/v0/folds"),
                (f"GET /v0/recovery/clients ({args.clients:,} clients)",
                 "/v0/recovery/clients"),
            ]  # fmt: skip
            results = {label: timed(client, path, args.seconds) for label, path in rows}
            # A fold node's report: stored, its older record deleted, answered once on disk.
            report = "POST /v0/folds (a report, answered once on disk)"
            results[report] = timed(client, "/v0/folds", args.seconds, fold_report(1, 2000))
            client.close()
        finally:
            server.terminate()
            server.wait()
    anchor = results[rows[0][0]][0]
    table = Table(title=f"one console's requests, load average {load_average()}")
    for column in ("request", "µs / request", "x anchor", "answer bytes"):
        table.add_column(column, justify="left" if column == "request" else "right")
    for label, (seconds, size) in results.items():
        table.add_row(label, f"{seconds * 1e6:,.0f}", f"{seconds / anchor:.1f}", f"{size:,}")
    console.print(table)
    topics_poll = results[rows[3][0]][0]
    console.print(f"a Topics page open: {topics_poll / POLL_S * 100:.2f}% of one core "
                  f"(one GET /v0/topics every {POLL_S:.0f} s)")  # fmt: skip
    reporters = args.folds + args.clients
    console.print(f"{reporters:,} reporters at the default 5 s send {reporters / 5:.0f} "
                  f"reports/s; one report is answered in {results[report][0] * 1e3:.2f} ms "
                  "(most of it waiting for its WAL commit)")  # fmt: skip


if __name__ == "__main__":
    main()
