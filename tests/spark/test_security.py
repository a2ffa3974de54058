"""The Spark source and sink on a server with tokens (docs/security.md): the ``token``
option reaches the driver and the executors, and a token without the scope stops the
query with 403 forbidden."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from waymark.client import Client
from waymark.protocol import RecordIn

WAYMARK = str(Path(sys.executable).parent / "waymark")


def token_new(path: Path, name: str, *scopes: str) -> str:
    args = [WAYMARK, "token", "new", name, "--tokens", str(path)]
    for scope in scopes:
        args += ["--scope", scope]
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()[-1]


def test_source_to_sink_with_tokens(spark: Any, spawn_server, run: Any, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    producer = token_new(tokens, "producer", "write:in")
    pipeline = token_new(tokens, "pipeline", "read:in", "write:out")
    reader = token_new(tokens, "reader", "read:*")
    server = spawn_server(tmp_path / "data", "--tokens", str(tokens))
    with Client(server.url, token=producer) as client:
        client.append("in", [RecordIn.of({"i": i}) for i in range(20)])
    source = (spark.readStream.format("waymark").option("url", server.url)
              .option("topics", "in").option("token", pipeline).load())  # fmt: skip
    run(source.select("data").writeStream.format("waymark").option("url", server.url)
        .option("topic", "out").option("token", pipeline)
        .option("checkpointLocation", str(tmp_path / "ck")))  # fmt: skip
    with Client(server.url, token=reader) as client:
        assert [r.data for r in client.diff("out", 0).records] == [{"i": i} for i in range(20)]
    # The same query without the write scope on its output: refused, nothing written.
    with pytest.raises(Exception, match="forbidden"):
        run(source.select("data").writeStream.format("waymark").option("url", server.url)
            .option("topic", "elsewhere").option("token", pipeline)
            .option("checkpointLocation", str(tmp_path / "ck2")))  # fmt: skip
    with Client(server.url, token=reader) as client:
        assert "elsewhere" not in [t.name for t in client.list_topics()]
