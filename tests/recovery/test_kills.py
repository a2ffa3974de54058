"""A real server SIGKILLed at random points between appends, deletions, drops, seals
and change checkpoints, restarted, in a loop (docs/semantics/recovery.md §1.6): every
change the log acknowledged is reported to a client that never receipted anything,
at its version or a later one, and nothing that never changed is.

Each seed plays ``KILLS`` kills of one data directory, 200 across the seeds (31 to 48 s
on two loaded cores; the suite runs it on one worker while the other runs the rest). The
servers are ``waymark serve`` processes forked from a process that imported the server
once (``tests/zygote.py``): a restart costs a fork and a restore, not an interpreter.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.conftest import readable

from waymark.client import ApiError, Client, TransportError
from waymark.protocol import ConfigPatch, Durability, RecordIn
from waymark.recovery import LocalReceiptStore, RecoveryService, TopicCheckpoints

ZYGOTE = Path(__file__).resolve().parents[1] / "zygote.py"
SEEDS = range(8)
KILLS = 25  # per seed: 200 across the seeds
TOPICS = ("orders", "users")
TAGS = ("a", "b", "c", None)
INTERVAL_S = 0.03  # --checkpoint-interval-s: a kill lands before, during or after one
SERVE = ("--checkpoint-interval-s", str(INTERVAL_S), "--seal-interval-s", "0.1",
         "--wal-shards", "2")  # fmt: skip
Version = tuple[int, int]  # (epoch, seq)


class Zygote:
    """Forks ``waymark serve`` processes (see the module's docstring)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip

    def _line(self) -> str:
        assert self.process.stdout is not None
        assert readable(self.process.stdout, 60), "the forked server printed nothing"
        return self.process.stdout.readline()

    def serve(self, data_dir: Path) -> tuple[int, str]:
        """Start ``waymark serve`` on ``data_dir``: its pid and URL."""
        assert self.process.stdin is not None
        args = ["--port", "0", "--data-dir", str(data_dir), *SERVE]
        self.process.stdin.write(json.dumps(args) + "\n")
        self.process.stdin.flush()
        line = self._line()
        while line == "waymark stopped\n":  # the last child, stopped cleanly
            line = self._line()
        pid = int(line.removeprefix("pid "))
        line = self._line()
        assert line.startswith("waymark listening on "), line
        url = line.split()[-1]
        with Client(url, timeout=20) as client:
            client.health()  # the socket listens before the app runs: until it answers
        return pid, url

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def gone(pid: int, timeout: float = 20.0) -> None:
    """Until process ``pid`` no longer exists (the zygote reaps it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"server {pid} outlived its kill"
        time.sleep(0.002)


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    forks = Zygote()
    yield forks
    forks.close()


@dataclass
class Model:
    """What the log acknowledged, per key: its newest change's version."""

    acked: dict[str, Version] = field(default_factory=dict)
    tried: set[str] = field(default_factory=set)  # every key a request may have changed
    epochs: dict[str, int] = field(default_factory=dict)  # the topics' instances, if known

    def changed(self, key: str, version: Version) -> None:
        self.acked[key] = max(self.acked.get(key, (-1, -1)), version)


def play(client: Client, model: Model, rng: random.Random, stop: threading.Event) -> None:
    """Requests until the server dies (or ``stop``); only answered ones count as acked."""
    while not stop.is_set():
        topic = rng.choice(TOPICS)
        roll = rng.random()
        if topic not in model.epochs:
            state = client.put_topic(topic, ConfigPatch(durability=Durability.FSYNC))[0]
            model.epochs[topic] = state.epoch
        epoch = model.epochs[topic]
        if roll < 0.75:
            tags = [rng.choice(TAGS) for _ in range(rng.randint(1, 3))]
            keys = [topic if t is None else f"{topic}/{t}" for t in tags]
            model.tried.update(keys)
            seqs = client.append(topic, [RecordIn.of(i, tag=t) for i, t in enumerate(tags)]).seqs
            for key, seq in zip(keys, seqs, strict=True):
                model.changed(key, (epoch, seq))
        elif roll < 0.9:
            tag = rng.choice(TAGS[:-1])
            model.tried.add(f"{topic}/{tag}")
            deleted = client.delete(topic, match=tag)
            if deleted.deleted:  # it took the seq after the head it found for itself
                model.changed(f"{topic}/{tag}", (epoch, deleted.head_seq))
        else:
            state = client.get_topic(topic)
            model.tried.add(topic)
            del model.epochs[topic]  # unknown until the next put: the drop may land
            client.delete_topic(topic)
            if state.head_seq > 0:  # the drop is named at the seq it never handed out
                model.changed(topic, (epoch, state.next_seq))


@pytest.mark.parametrize("seed", SEEDS)
def test_every_acked_change_survives_random_kills(
    zygote: Zygote, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    data = tmp_path / "data"
    receipts = LocalReceiptStore(tmp_path / "receipts.db")
    model = Model()
    pid, url = zygote.serve(data)
    first = RecoveryService(TopicCheckpoints(url), receipts, "never-receipts", recent_s=0,
                            report=False)  # fmt: skip
    assert list(first.subscribe(lambda committed: None)) == []  # a first start: from here on
    first.close()
    for kill in range(KILLS):
        stop = threading.Event()
        # A SIGKILL at a random point: amid requests, a checkpoint, a seal, a restore's
        # rebuild; now and then a clean stop (SIGTERM) instead.
        sig = signal.SIGTERM if kill % 10 == 9 else signal.SIGKILL

        def kill_now(pid: int, sig: signal.Signals, stop: threading.Event) -> None:
            stop.set()
            os.kill(pid, sig)

        timer = threading.Timer(rng.uniform(0, 3 * INTERVAL_S), kill_now, (pid, sig, stop))
        timer.start()
        with Client(url, timeout=10) as client:
            try:
                play(client, model, rng, stop)
            except TransportError:
                pass  # the server died under this request: it is not acked
            except ApiError:
                assert stop.is_set(), "refused while the server was up"  # (stopping: 503)
        timer.join()
        gone(pid)
        model.epochs.clear()  # a drop may have landed unanswered
        pid, url = zygote.serve(data)

    # The restarted server names what the last run left; then the query must see it all.
    service = RecoveryService(TopicCheckpoints(url), receipts, "never-receipts", recent_s=0,
                              report=False)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            missed = {c.key: (c.epoch, c.version) for c in service.missed()}
            short = {k: v for k, v in model.acked.items() if missed.get(k, (-1, -1)) < v}
            if not short:
                break
            assert time.monotonic() < deadline, (
                f"acked changes never reported: {short}; the query's: "
                f"{ {k: missed.get(k) for k in short} } (seed {seed})"
            )
            time.sleep(INTERVAL_S)
        assert set(missed) <= model.tried, "a key reported that no request changed"
    finally:
        service.close()
        receipts.close()
        os.kill(pid, signal.SIGKILL)
        gone(pid)
