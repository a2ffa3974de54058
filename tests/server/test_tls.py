"""TLS: ``waymark serve --tls-cert/--tls-key`` with a certificate the test makes, the
client trusting its CA by ``ca_file`` (docs/security.md)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
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


def _certificates(directory: Path) -> tuple[trustme.CA, Path, Path, Path]:
    """A CA, and a server certificate it signed: (ca, its file, chain file, key file)."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, chain, key = directory / "ca.pem", directory / "chain.pem", directory / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(key))
    for i, blob in enumerate(cert.cert_chain_pems):
        blob.write_to_path(str(chain), append=i > 0)
    return ca, ca_file, chain, key


def _serve_tls(directory: Path, chain: Path, key: Path, *args: str) -> tuple[str, subprocess.Popen]:
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "waymark"), "serve", "--port", "0",
         "--data-dir", str(directory / "data"), "--tls-cert", str(chain), "--tls-key", str(key),
         *args],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    if not readable(process.stdout, 20):
        process.kill()
        raise AssertionError("no listening line")
    return process.stdout.readline().split("listening on ")[1].strip(), process


def test_a_tls_handshake_that_never_completes_is_cut_at_the_header_timeout(
    tmp_path: Path,
) -> None:
    """A client that opens TCP and says nothing, or starts a ClientHello and stops, held
    its connection for the loop's default 60 s: it is closed after --header-timeout-s,
    and a normal client is served meanwhile."""
    _, ca_file, chain, key = _certificates(tmp_path)
    url, process = _serve_tls(tmp_path, chain, key, "--header-timeout-s", "1")
    host, port = url.removeprefix("https://").rsplit(":", 1)
    try:
        silent = [socket.create_connection((host, int(port))) for _ in range(20)]
        partial = [socket.create_connection((host, int(port))) for _ in range(20)]
        for sock in partial:  # a TLS record header of a ClientHello, then nothing
            sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        started = time.monotonic()
        with Client(url, ca_file=str(ca_file)) as client:
            assert client.health().status == "ok"
        for sock in silent + partial:
            sock.settimeout(10)
            with contextlib.suppress(ConnectionResetError):  # a reset is closed too
                assert sock.recv(4096) == b""  # closed by the server: EOF
            sock.close()
        assert time.monotonic() - started < 5, "the handshake was not cut at 1 s"
    finally:
        process.kill()
        process.wait()
