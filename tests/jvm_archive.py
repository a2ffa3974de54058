"""A class-data-sharing archive of Spark's JVM classes for the suite's JVMs (Java 17's
AppCDS, ``-XX:SharedArchiveFile``): a JVM started with it maps the classes it would
otherwise load, verify and link from pyspark's jars one by one. The suite starts ~25
JVMs (local sessions, drivers it SIGKILLs and restarts, a standalone cluster's daemons
and executors); each spent ~11 s of CPU to start a session, ~5 s with the archive.

The archive is made once per venv and JDK (the key below), by a small local session
run with ``-XX:ArchiveClassesAtExit`` in a process of its own, in the background while
xdist's workers collect: a JVM that starts before the archive is in place runs without
it, as every JVM did before. The environment hands it to every JVM the tests start,
however deep, through the variables Spark reads (``handing`` below): not
``JAVA_TOOL_OPTIONS``, for which every JVM prints "Picked up JAVA_TOOL_OPTIONS: ..." on
its stderr (into the tests' output, a driver's log, each executor's). A JVM whose
classpath does not match the archive (a venv of tests/pythons) ignores it:
``-Xshare:auto`` is the default, and the archive's warnings are off, since the JVM's
log goes to stdout, which Spark's launcher reads.

A run shorter than the making (one Spark file in a fresh venv) waits for it at its end
(tests/conftest.py), up to two minutes, so the next run has it.

``python tests/jvm_archive.py OUT`` is the process that makes it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

OPTIONS = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def key() -> str | None:
    """The archive's name for this venv's pyspark jars and this JDK, or None without
    Java or pyspark. CDS refuses an archive whose jars changed; a new name is made."""
    java = shutil.which("java")
    spec = importlib.util.find_spec("pyspark")
    if java is None or spec is None or spec.origin is None:
        return None
    jars = Path(spec.origin).parent / "jars"
    parts = [os.path.realpath(java), str(os.stat(os.path.realpath(java)).st_mtime_ns)]
    parts += [f"{e.name}:{e.stat().st_size}:{e.stat().st_mtime_ns}" for e in os.scandir(jars)]
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()[:16]


def start(directory: Path) -> subprocess.Popen[bytes] | None:
    """Point the JVMs (``handing``) at the archive in ``directory``; start making it if
    it is not there yet (the returned process). Nothing without Java or pyspark."""
    name = key()
    if name is None:
        return None
    archive = directory / f"spark-{name}.jsa"
    env = dict(os.environ)
    os.environ.update(handing(f"-XX:SharedArchiveFile={archive} {OPTIONS}", os.environ))
    if archive.exists():
        return None
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():  # ~170 MB each: those of other jars or JDKs, or cut short
        if old.name.endswith(".tmp") and _alive(int(old.name.split(".")[-2])):
            continue  # another run is making it
        old.unlink(missing_ok=True)
    return subprocess.Popen(
        [sys.executable, __file__, str(archive)], env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def handing(options: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that hand JVM ``options`` to every JVM of Spark the tests start,
    added to those ``environ`` has. PySpark's launcher adds PYSPARK_SUBMIT_ARGS to each
    driver's spark-submit: the drivers' default options, and the executors' (a driver
    gives them to a cluster's executors); the standalone daemons read
    SPARK_MASTER_OPTS and SPARK_WORKER_OPTS (`waymark cluster` sets their shared
    SPARK_DAEMON_JAVA_OPTS). Spark's launcher JVM gets none: its classpath is not the
    archive's."""
    confs = [f"spark.{role}.defaultJavaOptions={options}" for role in ("driver", "executor")]
    submit = " ".join(f"--conf {shlex.quote(conf)}" for conf in confs)
    handed = {
        "PYSPARK_SUBMIT_ARGS": f"{submit} {environ.get('PYSPARK_SUBMIT_ARGS', 'pyspark-shell')}"
    }
    for name in ("SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS"):
        handed[name] = f"{environ[name]} {options}" if environ.get(name) else options
    return handed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def make(archive: Path) -> None:
    """A local session doing a little of what the tests do (a batch aggregate, Arrow,
    a Python UDF over Arrow, a streaming query with a checkpoint); its JVM writes the
    classes it loaded at exit. Written beside, then renamed: a JVM never maps half."""
    from waymark.spark.demo_job import JVM_OPTIONS

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    options = f"{JVM_OPTIONS} -XX:ArchiveClassesAtExit={partial}"
    spark = (
        SparkSession.builder.master("local[2,2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", options)
        .getOrCreate()
    )
    df = spark.range(1000).select((F.col("id") % 3).alias("k"), F.col("id").alias("v"))
    df.groupBy("k").agg(F.sum("v"), F.count("v")).toArrow()
    df.mapInArrow(lambda batches: batches, df.schema).collect()
    with tempfile.TemporaryDirectory() as work:
        spark.range(10).write.json(f"{work}/in")
        query = (
            spark.readStream.schema("id BIGINT").json(f"{work}/in").writeStream
            .foreachBatch(lambda batch, _: batch.count())
            .option("checkpointLocation", f"{work}/checkpoint").trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(300)
    jvm = spark.sparkContext._gateway.proc  # type: ignore[union-attr]  # noqa: SLF001
    spark.stop()
    jvm.stdin.close()  # the JVM exits when its parent's pipe closes, writing the archive
    if jvm.wait(300) == 0 and partial.exists():
        partial.rename(archive)
    partial.unlink(missing_ok=True)


if __name__ == "__main__":
    make(Path(sys.argv[1]))
