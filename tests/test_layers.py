"""The layers hold: each package imports only the layers below it.

The contracts are ``[tool.importlinter]`` in pyproject.toml (docs/architecture.md,
"Enforcing the layers"); ``lint-imports`` checks every import, direct or through
another module, including those under ``TYPE_CHECKING`` and inside functions.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(src: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the contracts of pyproject.toml over ``waymark`` as found under ``src``
    (default: the installed one, which is this repository's src/)."""
    env = dict(os.environ)
    if src is not None:
        # PYTHONPATH comes before the editable install's path entry, so grimp reads this copy.
        env["PYTHONPATH"] = str(src)
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_the_layer_contracts_are_kept() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_client_import_of_the_engine_breaks_a_contract(tmp_path: Path) -> None:
    # The check is live: the client reaching into the engine (even for a type) fails it.
    shutil.copytree(ROOT / "src" / "waymark", tmp_path / "waymark")
    calls = tmp_path / "waymark" / "client" / "calls.py"
    calls.write_text(calls.read_text() + "\nfrom waymark.log.errors import TopicError  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "client imports protocol only BROKEN" in result.stdout
    assert "waymark.client.calls -> waymark.log.errors" in result.stdout


def test_a_recovery_import_of_the_engine_breaks_a_contract(tmp_path: Path) -> None:
    # waymark.recovery is client-side: the engine's types are out of its reach.
    shutil.copytree(ROOT / "src" / "waymark", tmp_path / "waymark")
    ledger = tmp_path / "waymark" / "recovery" / "ledger.py"
    ledger.write_text(ledger.read_text() + "\nfrom waymark.log.changes import Changes  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "recovery (receipts) imports client, protocol and clock only BROKEN" in result.stdout


def test_a_pipeline_import_of_the_server_breaks_a_contract(tmp_path: Path) -> None:
    # waymark.pipeline reaches edges through the client only (docs/architecture.md).
    shutil.copytree(ROOT / "src" / "waymark", tmp_path / "waymark")
    edge = tmp_path / "waymark" / "pipeline" / "edge.py"
    edge.write_text(edge.read_text() + "\nfrom waymark.server.app import App  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "pipeline imports client, protocol, objstore and clock" in result.stdout
    assert "waymark.pipeline.edge -> waymark.server.app" in result.stdout


def test_a_spark_import_of_the_pipeline_edge_breaks_a_contract(tmp_path: Path) -> None:
    # The Spark stage uses the pipeline's locator, state and report modules only: its
    # edge reaches waymark.checkpoint, which Spark must not (docs/architecture.md).
    shutil.copytree(ROOT / "src" / "waymark", tmp_path / "waymark")
    edge = tmp_path / "waymark" / "spark" / "edge.py"
    edge.write_text(edge.read_text() + "\nfrom waymark.pipeline.edge import Sleep  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "spark reaches the server through client only" in result.stdout
    assert "waymark.spark.edge -> waymark.pipeline.edge" in result.stdout
