"""Transports over a caller's httpx client (``Client(url, http=httpx.Client(...))``):
the same requests and answers as :mod:`.transport`, sent by httpx, with its errors
turned into the client's (docs/client.md, "Transport"). Loaded only when asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import httpx

from .errors import ConnectError, TransportError, TransportTimeout
from .transport import Origin


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except httpx.TimeoutException as e:
        raise TransportTimeout(f"{type(e).__name__}: {e}") from e
    except httpx.ConnectError as e:
        raise ConnectError(f"{type(e).__name__}: {e}") from e
    except httpx.TransportError as e:
        raise TransportError(f"{type(e).__name__}: {e}") from e


def _headers(origin: Origin, headers: dict[str, str], body: bytes | None = None) -> dict[str, str]:
    """The call's headers and the client's token; httpx sends its own Host. Every body
    is JSON, and is refused unless it says so (docs/security.md, "Browsers")."""
    token = {k: v for k, v in origin.headers.items() if k == "authorization"}
    if body is not None:
        token["content-type"] = "application/json"
    return {**token, **headers}


class HttpxTransport:
    def __init__(self, http: httpx.Client, origin: Origin, connect_timeout: float) -> None:
        self._http, self._origin, self._connect = http, origin, connect_timeout

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float,
        idempotent: bool,
    ) -> httpx.Response:
        with _translated():
            return self._http.request(
                method, target, content=body, headers=_headers(self._origin, headers, body),
                timeout=httpx.Timeout(timeout, connect=self._connect),
            )  # fmt: skip

    @contextmanager
    def stream(
        self, method: str, target: str, headers: dict[str, str], read_timeout: float
    ) -> Iterator[HttpxStream]:
        timeout = httpx.Timeout(self._connect, read=read_timeout)
        with (
            _translated(),
            self._http.stream(
                method, target, headers=_headers(self._origin, headers), timeout=timeout
            ) as response,
        ):
            yield HttpxStream(response)


class HttpxStream:
    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    def __iter__(self) -> Iterator[bytes]:
        with _translated():
            yield from self.response.iter_bytes()

    def read(self) -> httpx.Response:
        with _translated():
            self.response.read()
        return self.response


class AsyncHttpxTransport:
    def __init__(self, http: httpx.AsyncClient, origin: Origin, connect_timeout: float) -> None:
        self._http, self._origin, self._connect = http, origin, connect_timeout

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float,
        idempotent: bool,
    ) -> httpx.Response:
        with _translated():
            return await self._http.request(
                method, target, content=body, headers=_headers(self._origin, headers, body),
                timeout=httpx.Timeout(timeout, connect=self._connect),
            )  # fmt: skip

    @asynccontextmanager
    async def stream(
        self, method: str, target: str, headers: dict[str, str], read_timeout: float
    ) -> AsyncIterator[AsyncHttpxStream]:
        timeout = httpx.Timeout(self._connect, read=read_timeout)
        with _translated():
            async with self._http.stream(
                method, target, headers=_headers(self._origin, headers), timeout=timeout
            ) as response:
                yield AsyncHttpxStream(response)


class AsyncHttpxStream:
    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _translated():
            async for chunk in self.response.aiter_bytes():
                yield chunk

    async def read(self) -> httpx.Response:
        with _translated():
            await self.response.aread()
        return self.response
