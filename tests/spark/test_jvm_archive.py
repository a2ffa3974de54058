"""The suite's class archive (tests/jvm_archive.py) reaches the drivers without
JAVA_TOOL_OPTIONS, for which every JVM prints "Picked up JAVA_TOOL_OPTIONS: ..." into
the tests' output (tests/spark/test_cluster.py checks the cluster's daemons and
executors, test_register.py a driver's stderr)."""

from __future__ import annotations

from typing import Any

import pytest


def test_the_driver_maps_the_archive_and_has_no_java_tool_options(
    spark: Any, request: pytest.FixtureRequest
) -> None:
    if getattr(request.config, "cache", None) is None:
        pytest.skip("no cache, so no class archive in this run (-p no:cacheprovider)")
    jvm = spark.sparkContext._jvm  # noqa: SLF001  # py4j: the driver JVM itself
    runtime = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert any(a.startswith("-XX:SharedArchiveFile=") for a in runtime.getInputArguments())
    assert jvm.java.lang.System.getenv("JAVA_TOOL_OPTIONS") is None
