"""The smoke run of one interpreter (tests/pythons/test_pythons.py): run with a venv's
Python that has ``waymark[all]`` installed from its wheel, it starts that venv's
``waymark serve``, appends and reads back through the client, and reads the topic
with a local Spark session through the ``waymark`` data source. Prints one JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from waymark.client import Client
from waymark.protocol import RecordIn

RECORDS = 10


def main() -> None:
    bin_dir = Path(sys.executable).parent
    data = tempfile.mkdtemp()
    server = subprocess.Popen(
        [str(bin_dir / "waymark"), "serve", "--port", "0", "--data-dir", data],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        while line and not line.startswith("waymark listening on "):
            line = server.stdout.readline()
        assert line, "the server printed no address"
        url = line.split()[-1]
        with Client(url, timeout=30) as client:
            client.health()
            client.append("clicks", [RecordIn.of({"n": i}, tag="t") for i in range(RECORDS)])
            read = [r.data for r in client.diff("clicks", 0).records]
        assert read == [{"n": i} for i in range(RECORDS)], read

        os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers run this venv too
        from pyspark.sql import SparkSession

        from waymark import spark as ws
        from waymark.spark.demo_job import JVM_OPTIONS

        # JVM_OPTIONS (C1 only, serial GC): what the demo's driver runs with, for a short
        # job on few cores (a start costs about half the CPU).
        session = (SparkSession.builder.master("local[1]").appName("smoke")
                   .config("spark.ui.enabled", "false")
                   .config("spark.driver.extraJavaOptions", JVM_OPTIONS).getOrCreate())  # fmt: skip
        ws.register(session)
        source = (session.readStream.format("waymark").option("url", url)
                  .option("topics", "clicks").load())  # fmt: skip
        query = (source.writeStream.format("memory").queryName("clicks")
                 .trigger(availableNow=True).start())  # fmt: skip
        query.awaitTermination(300)
        got = session.sql("SELECT data FROM clicks").collect()
        rows = sorted(json.loads(r.data)["n"] for r in got)
        session.stop()
        assert rows == list(range(RECORDS)), rows
        print(json.dumps({"python": sys.version.split()[0], "read": len(read), "spark": len(rows)}))
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
