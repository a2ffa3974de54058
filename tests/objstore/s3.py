"""A real S3 over HTTP (moto's server on a free 127.0.0.1 port) and stores on both backends.

Imported by the conftest.py of tests/objstore and tests/kv.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from waymark.clock import ManualClock
from waymark.kv.server import free_port
from waymark.objstore import ObjectStore, open_store

_buckets = itertools.count()


class MotoS3:
    """moto's S3 server, reached the way a user reaches S3: ``AWS_*`` environment variables."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)

    def start(self) -> MotoS3:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def environment(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
        }

    def create_bucket(self) -> str:
        import boto3

        name = f"waymark-test-{next(_buckets)}"
        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3().start()
    saved = {k: os.environ.get(k) for k in server.environment()}
    os.environ.update(server.environment())
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture
def s3_url(moto_s3: MotoS3) -> str:
    """A fresh bucket per test, with a prefix: ``s3://bucket/prefix``."""
    return f"s3://{moto_s3.create_bucket()}/replicas"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["file", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return (tmp_path / "objects").as_uri()
    return request.getfixturevalue("s3_url")


@pytest.fixture
def make_objstore(store_url: str, clock: ManualClock) -> Callable[[], ObjectStore]:
    return lambda: open_store(store_url, clock=clock)
