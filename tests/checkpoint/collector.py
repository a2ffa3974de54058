"""A real HTTP collector for the shipper tests and benchmark, run as its own process.

A bare asyncio HTTP/1.1 server (keep-alive, Content-Length bodies), because the
faults it plays need the socket: a connection dropped without a reply cannot be
produced from behind an ASGI framework. Each request, in order:

- is delayed by ``--delay-ms`` plus a random extra up to ``--jitter-ms``, so
  batches posted together are acked out of order;
- is dropped (connection closed, no reply) with probability ``--drop-rate``;
- gets 503 with probability ``--fail-rate``, or always for the first ``--fail-first``;
- gets 413 if it holds a record tagged ``--reject-tag``;
- else gets 200, and with ``--log`` the batch's seqs are appended to that file
  (one JSON line per acked batch) before the reply leaves.

Usage: python collector.py [options]; prints ``collector listening on PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re

import orjson

_SEQ = re.compile(rb'"\$seq":(\d+)')


class Collector:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.requests = 0
        self.reject_marker = f'"$tag":"{args.reject_tag}"'.encode() if args.reject_tag else None
        self.log = open(args.log, "ab") if args.log else None  # noqa: SIM115 - lives as long as the process

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head)[1])  # type: ignore[index]
                body = await reader.readexactly(length)
                status = await self.answer(body)
                if status is None:
                    writer.transport.abort()
                    return
                reply = b'{"ok":true}' if status == 200 else b'{"error":"collector says no"}'
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (status, len(reply), reply)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def answer(self, body: bytes) -> int | None:
        args, rng = self.args, self.rng
        self.requests += 1
        delay = args.delay_ms + rng.random() * args.jitter_ms
        if delay:
            await asyncio.sleep(delay / 1000)
        if rng.random() < args.drop_rate:
            return None
        if self.requests <= args.fail_first or rng.random() < args.fail_rate:
            return 503
        if self.reject_marker is not None and self.reject_marker in body:
            return 413
        if self.log is not None:
            seqs = [int(m) for m in _SEQ.findall(body)]
            self.log.write(orjson.dumps({"topic": orjson.loads(body)["topic"], "seqs": seqs}))
            self.log.write(b"\n")
            self.log.flush()
        return 200


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log")
    parser.add_argument("--delay-ms", type=float, default=0)
    parser.add_argument("--jitter-ms", type=float, default=0)
    parser.add_argument("--drop-rate", type=float, default=0)
    parser.add_argument("--fail-rate", type=float, default=0)
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--reject-tag")
    parser.add_argument("--seed", type=int, default=1)
    collector = Collector(parser.parse_args())
    server = await asyncio.start_server(collector.handle, "127.0.0.1", collector.args.port)
    print(f"collector listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
