"""TLS: ``waymark serve --tls-cert/--tls-key`` with a certificate the test makes, the
client trusting its CA by ``ca_file`` (docs/security.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trustme
from tests.conftest import readable

from waymark.client import Client, ConnectError
from waymark.protocol import RecordIn


def test_https_round_trip_with_a_self_signed_ca(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, chain, key = tmp_path / "ca.pem", tmp_path / "chain.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(key))
    for i, blob in enumerate(cert.cert_chain_pems):
        blob.write_to_path(str(chain), append=i > 0)
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "waymark"), "serve", "--port", "0",
         "--data-dir", str(tmp_path / "data"), "--tls-cert", str(chain), "--tls-key", str(key)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert readable(process.stdout, 20), "no listening line"
        url = process.stdout.readline().split("listening on ")[1].strip()
        assert url.startswith("https://127.0.0.1:")
        with Client(url, ca_file=str(ca_file)) as client:
            assert client.append("secure", [RecordIn.of({"n": 1})]).seqs == [1]
            page = client.diff("secure", 0)
            assert [r.data for r in page.records] == [{"n": 1}]
            event = next(iter(client.watch("secure", max_retries=0)))
            assert event.record is not None and event.record.data == {"n": 1}
        # Without the CA the certificate is not trusted; plain http is not served.
        with pytest.raises(ConnectError), Client(url) as client:
            client.health()
        with pytest.raises(httpx.TransportError):
            httpx.get(url.replace("https", "http") + "/v0/health", timeout=5)
    finally:
        process.kill()
        process.wait()
