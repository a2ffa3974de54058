"""Shared fixtures for tests/kv: one real nats-server with JetStream for the session."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

# moto's S3 server and a store URL per backend (file://, s3://), shared with tests/objstore.
from tests.objstore.s3 import moto_s3, s3_url, store_url  # noqa: F401

from waymark.kv import Connection, NatsConnectionConfig, open_store
from waymark.kv.server import EmbeddedNats
from waymark.kv.stores.protocol import SnapshotStore

BACKENDS = ("append-log", "lmdb", "rocksdb")
_names = itertools.count()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path_factory.mktemp("nats-js")) as server:
        yield server


@pytest.fixture
async def conn(nats_server: EmbeddedNats) -> AsyncIterator[Connection]:
    async with Connection(NatsConnectionConfig(url=nats_server.url, timeout=5.0)) as c:
        yield c


@pytest.fixture
def bucket_name() -> str:
    return f"t{next(_names)}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store_spec(backend: str, tmp_path: Path) -> str:
    """A ``BACKEND:PATH`` spec in this test's temp dir, for each backend."""
    return f"{backend}:{tmp_path / ('fold.log' if backend == 'append-log' else 'fold')}"


@pytest.fixture
def make_store(store_spec: str) -> Callable[[], SnapshotStore]:
    """Opens (or re-opens) this test's fold store."""
    return lambda: open_store(store_spec)
