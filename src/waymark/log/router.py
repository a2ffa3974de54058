"""Routers (§8): forwarding rules source -> dest, at-least-once, per-source FIFO.

Definitions are control frames (journaled, replayed); each router's cursor is the
last source seq it forwarded, kept in memory and in the checkpoint catalog. After a
crash forwarding resumes from the recovered cursor, so copies may repeat in dest,
never go missing. Forwarding is :meth:`Routers.forward`: a synchronous step the
server schedules after commits, so a source append never waits on it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from .config import ConfigPatch
from .errors import ErrorCode, TopicError
from .journal import router_frame
from .records import RecordIn, check_topic_name, encode_batch

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

# allow_cycle routes stop forwarding a record after this many hops, so a cycle terminates.
HOP_CAP = 8
GUARANTEES = ("at_least_once",)  # exactly_once is not in this slice
# A dest refusing these holds the cursor (§8.4): record_too_large is a page bigger than a
# discard:"reject" dest's whole cap, which is retried record by record.
PUSHBACK = (ErrorCode.TOPIC_FULL, ErrorCode.RECORD_TOO_LARGE, ErrorCode.STORAGE_UNAVAILABLE)


@dataclass(slots=True)
class Router:
    name: str
    source: str
    dest: str
    preserve_node: bool
    preserve_tag: bool
    allow_cycle: bool
    guarantee: str
    created_ts: int
    source_epoch: int
    dest_epoch: int
    cursor: int  # the last source seq forwarded (or skipped as a gap)
    trimmed: int = 0  # source records evicted before they were forwarded (in memory)

    def definition(self) -> tuple[object, ...]:
        return (self.source, self.dest, self.preserve_node, self.preserve_tag,
                self.allow_cycle, self.guarantee)  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "dest": self.dest,
            "preserve_node": self.preserve_node,
            "preserve_tag": self.preserve_tag,
            "filter": None,
            "allow_cycle": self.allow_cycle,
            "guarantee": self.guarantee,
            "created_ts": self.created_ts,
            "cursor": self.cursor,
            "source_trimmed": self.trimmed,
        }


@dataclass(frozen=True, slots=True)
class Forwarded:
    copies: int  # records appended to dests
    pending: bool  # some router has more to forward, or is held back by dest backpressure
    blocked: bool  # a dest refused with topic_full: retry later


class Routers:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._routers: dict[str, Router] = {}
        # Hop counts of copies made by allow_cycle routers: (topic, epoch, seq) -> hops.
        # In memory only (§8.5): after a restart recopied records start again from 0.
        self._hops: dict[tuple[str, int, int], int] = {}

    # --- definitions --------------------------------------------------------------
    def put(
        self,
        name: str,
        source: str,
        dest: str,
        *,
        preserve_node: bool = True,
        preserve_tag: bool = True,
        allow_cycle: bool = False,
        guarantee: str = "at_least_once",
        create_dest: bool = True,
    ) -> tuple[Router, bool]:
        """Create a router (or return the identical existing one); returns (router, created)."""
        check_topic_name(name)
        check_topic_name(source)
        check_topic_name(dest)
        if guarantee not in GUARANTEES:
            raise TopicError(ErrorCode.INVALID_REQUEST, "guarantee is at_least_once",
                             {"guarantee": guarantee})  # fmt: skip
        if source == dest:
            raise TopicError(ErrorCode.ROUTER_CYCLE, "a router cannot forward a topic to itself",
                             {"cycle": [source, source]})  # fmt: skip
        existing = self._routers.get(name)
        wanted = (source, dest, preserve_node, preserve_tag, allow_cycle, guarantee)
        if existing is not None:
            if existing.definition() == wanted:
                return existing, False
            raise TopicError(ErrorCode.TOPIC_EXISTS_INCOMPATIBLE,
                             f"router {name!r} exists with another definition",
                             {"router": name, "reason": "router_exists"})  # fmt: skip
        engine = self._engine
        for other in self._routers.values():
            if other.dest == dest and other.source != source:
                raise TopicError(
                    ErrorCode.TOPIC_EXISTS_INCOMPATIBLE,
                    f"topic {dest!r} already derives from {other.source!r}",
                    {"reason": "router_dest_fan_in", "dest": dest, "source": other.source,
                     "router": other.name},
                )  # fmt: skip
        if not allow_cycle:
            path = self._path(dest, source)
            if path is not None:
                raise TopicError(ErrorCode.ROUTER_CYCLE, "the router would close a cycle",
                                 {"cycle": [source, *path]})  # fmt: skip
        if not create_dest:
            for topic in (source, dest):
                engine._existing(topic)
        # Lazily created endpoints (§8.6): an empty config patch takes the defaults.
        for topic in (source, dest):
            if topic not in engine._topics:
                engine.put_topic(topic, ConfigPatch())
        src, dst = engine._topics[source], engine._topics[dest]
        router = Router(name, source, dest, preserve_node, preserve_tag, allow_cycle, guarantee,
                        engine.clock.now_ms(), src.epoch, dst.epoch,
                        src.head_seq)  # fmt: skip
        engine._write(source, router_frame(name, asdict(router)))
        self._routers[name] = router
        return router, True

    def has_routers(self) -> bool:
        return bool(self._routers)

    def get(self, name: str) -> Router:
        router = self._routers.get(name)
        if router is None:
            raise TopicError(ErrorCode.ROUTER_NOT_FOUND, f"router {name!r} does not exist",
                             {"router": name})  # fmt: skip
        return router

    def list(self) -> list[Router]:
        return [self._routers[n] for n in sorted(self._routers)]

    def delete(self, name: str) -> None:
        router = self.get(name)
        self._engine._write(router.source, router_frame(name, None))
        del self._routers[name]

    def topic_dropped(self, name: str, epoch: int) -> None:
        """A topic instance is gone: so are the routers touching it (§8.6). Called on the
        live path and on replay, where the epochs keep a later instance's routers."""
        for router in list(self._routers.values()):
            if (router.source, router.source_epoch) == (name, epoch) or (
                router.dest, router.dest_epoch) == (name, epoch):  # fmt: skip
                del self._routers[router.name]

    def _path(self, start: str, goal: str) -> list[str] | None:
        """Topics along a router path start -> ... -> goal, if there is one."""
        seen = {start}
        stack = [[start]]
        while stack:
            path = stack.pop()
            if path[-1] == goal:
                return path
            for router in self._routers.values():
                if router.source == path[-1] and router.dest not in seen:
                    seen.add(router.dest)
                    stack.append([*path, router.dest])
        return None

    # --- forwarding ---------------------------------------------------------------
    def forward(self, max_records: int = 1000) -> Forwarded:
        """Forward up to ``max_records`` source records per router, in source order."""
        copies = 0
        pending = blocked = False
        for router in self._routers.values():
            step = self._try(router, max_records)
            if step is None and max_records > 1:
                # An append is atomic: a page too big for a full dest may fit one by one.
                step = self._try(router, 1)
                step = None if step is None else (step[0], True)
            if step is None:
                blocked = pending = True  # backpressure: the cursor holds, retry later
                continue
            n, more = step
            copies += n
            pending = pending or more
        return Forwarded(copies, pending, blocked)

    def _try(self, router: Router, limit: int) -> tuple[int, bool] | None:
        """One router's step, or None when its dest pushes back."""
        try:
            return self._forward_one(router, limit)
        except TopicError as exc:
            if exc.code in PUSHBACK:
                return None
            raise

    def _forward_one(self, router: Router, limit: int) -> tuple[int, bool]:
        engine = self._engine
        page = engine.diff(router.source, router.cursor, limit=limit, per_record=True)
        gap = page.tombstone
        if gap is not None and gap.reason != "lost":
            # Evicted (cap/ttl) before forwarding: counted and logged, never silent. (A
            # "lost" gap is seqs a crash skipped, which the source itself reports.)
            router.trimmed += gap.missed_estimate
            log.warning(
                "router %s: source %s evicted %d..%d (%s) before forwarding",
                *(router.name, router.source, gap.gap_from, gap.gap_to, gap.reason),
            )
        records = page.records()
        source_topic = engine._topics[router.source]
        copies: list[RecordIn] = []
        hops: list[int] = []
        for record in records:
            seen = self._hops.get((router.source, source_topic.epoch, record["$seq"]), 0)
            if router.allow_cycle and seen >= HOP_CAP:
                continue
            copies.append(RecordIn(
                msgspec.Raw(orjson.dumps(record["data"])),
                record.get("$tag") if router.preserve_tag else None,
                record.get("$node") if router.preserve_node else None,
                record.get("meta"),
            ))  # fmt: skip
            hops.append(seen + 1)
        if copies:
            result = engine.append_encoded(
                router.dest, encode_batch(copies, engine.limits), create=False
            )
            if router.allow_cycle:
                epoch = engine._topics[router.dest].epoch
                for seq, hop in zip(result.seqs, hops, strict=True):
                    self._hops[(router.dest, epoch, seq)] = hop
        router.cursor = page.next_from_seq
        if router.allow_cycle:
            self._forget_hops(router.source, source_topic.epoch)
        return len(copies), page.next_from_seq < page.head_seq

    def _forget_hops(self, topic: str, epoch: int) -> None:
        """Hop counts are needed until every router out of ``topic`` has passed them."""
        floor = min((r.cursor for r in self._routers.values() if r.source == topic), default=0)
        for key in [k for k in self._hops if k[0] == topic and (k[1] != epoch or k[2] <= floor)]:
            del self._hops[key]

    # --- durability ---------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        """Definitions and cursors for the checkpoint catalog."""
        return [asdict(r) for r in self._routers.values()]

    def restore(self, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            router = Router(**entry)
            self._routers[router.name] = router

    def replay(self, body: dict[str, Any]) -> None:
        """A router control frame, after the checkpoint the catalog restored."""
        name, definition = body["router"], body["def"]
        if definition is None:
            self._routers.pop(name, None)
        elif name not in self._routers:
            self._routers[name] = Router(**definition)

    def settle_recovered(self) -> None:
        """After replay: a router whose endpoint instance is gone does not exist."""
        topics = self._engine._topics
        for router in list(self._routers.values()):
            src, dst = topics.get(router.source), topics.get(router.dest)
            if src is None or dst is None or (src.epoch, dst.epoch) != (
                router.source_epoch, router.dest_epoch):  # fmt: skip
                del self._routers[router.name]
