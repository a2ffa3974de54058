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

from waymark.client import Client, ConnectError, TransportError
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
        # waymark ship trusts the CA from WAYMARK_CA, as every command does (and from its
        # older WAYMARK_CA_FILE): it reads the batch and fails only at the dead collector.
        for name in ("WAYMARK_CA", "WAYMARK_CA_FILE", None):
            shipped = _ship_once(
                url, tmp_path / f"ship-{name}", {name: str(ca_file)} if name else {}
            )
            assert shipped.returncode == 6, shipped.stderr
            assert ("collector http://" in shipped.stderr) == (name is not None), shipped.stderr
    finally:
        process.kill()
        process.wait()


def _ship_once(url: str, state: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``waymark ship --once`` of topic ``secure`` to a collector nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("WAYMARK_CA")}
    return subprocess.run(
        [str(Path(sys.executable).parent / "waymark"), "ship", "--topic", "secure",
         "--to", f"http://127.0.0.1:{dead}/", "--once", "--state", str(state),
         "--retry-base-ms", "10", "--retry-budget-s", "0.3"],
        capture_output=True, text=True, timeout=60,
        env={**environ, "WAYMARK_URL": url, **env},
    )  # fmt: skip


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


def test_a_client_ca_admits_only_clients_with_its_certificates(tmp_path: Path) -> None:
    """``--tls-client-ca``: the TLS handshake asks for a client certificate and checks it
    against that CA; without one, or with one another CA signed, nothing is served."""
    _, ca_file, chain, key = _certificates(tmp_path)
    clients_ca = trustme.CA()
    (tmp_path / "clients-ca.pem").write_bytes(clients_ca.cert_pem.bytes())
    mine, stranger = tmp_path / "mine", tmp_path / "stranger"
    for directory, issuer in ((mine, clients_ca), (stranger, trustme.CA())):
        directory.mkdir()
        cert = issuer.issue_cert("shipper@example")
        cert.private_key_pem.write_to_path(str(directory / "key.pem"))
        for i, blob in enumerate(cert.cert_chain_pems):
            blob.write_to_path(str(directory / "cert.pem"), append=i > 0)
    url, process = _serve_tls(tmp_path, chain, key,
                              "--tls-client-ca", str(tmp_path / "clients-ca.pem"))  # fmt: skip
    try:
        certified = (str(mine / "cert.pem"), str(mine / "key.pem"))
        with Client(url, ca_file=str(ca_file), client_cert=certified) as client:
            assert client.append("certified", [RecordIn.of(1)]).seqs == [1]
        # TLS 1.3: the client's side of the handshake ends before the server checks its
        # certificate, so the refusal (an alert, then the close) comes at the first read.
        with pytest.raises(TransportError), Client(url, ca_file=str(ca_file)) as client:
            client.health()
        with pytest.raises(TransportError), Client(
            url, ca_file=str(ca_file),
            client_cert=(str(stranger / "cert.pem"), str(stranger / "key.pem")),
        ) as client:  # fmt: skip
            client.health()
    finally:
        process.kill()
        process.wait()


def test_a_client_ca_needs_tls_and_a_readable_file(tmp_path: Path) -> None:
    _, _, chain, key = _certificates(tmp_path)
    waymark = str(Path(sys.executable).parent / "waymark")
    base = [waymark, "serve", "--port", "0", "--data-dir", str(tmp_path / "data")]
    plain = subprocess.run([*base, "--tls-client-ca", str(chain)], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert plain.returncode == 2 and "needs --tls-cert" in plain.stderr
    missing = subprocess.run([*base, "--tls-cert", str(chain), "--tls-key", str(key),
                              "--tls-client-ca", str(tmp_path / "none.pem")],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 2 and "cannot use --tls-client-ca" in missing.stderr
    assert "listening" not in missing.stdout
