"""The client stands alone: it loads the wire contract and its own HTTP transport, never
the engine, the server, numpy, prometheus_client or httpx (that only for ``http=``); the
contract loads msgspec only."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN_FOR_CLIENT = ("waymark.log", "waymark.server", "numpy", "prometheus_client", "httpx")


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    probe = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True).stdout  # fmt: skip
    return set(out.split())


def test_import_waymark_client_loads_neither_engine_nor_server_nor_their_dependencies() -> None:
    loaded = loaded_after("import waymark.client")
    assert not {m for m in loaded if m.startswith(FORBIDDEN_FOR_CLIENT)}
    assert {"waymark.protocol", "waymark.client.transport"} <= loaded


def test_the_protocol_depends_on_msgspec_only() -> None:
    baseline = loaded_after("import msgspec")
    added = loaded_after("import waymark.protocol, waymark.protocol.openapi") - baseline
    third_party = {m.split(".")[0] for m in added} - set(sys.stdlib_module_names)
    assert third_party == {"waymark"}
    ours = {m for m in added if m.split(".")[0] == "waymark"} - {"waymark"}
    assert ours and all(m.startswith("waymark.protocol") for m in ours)
