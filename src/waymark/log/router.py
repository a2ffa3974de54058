"""Routers (docs/semantics/topics.md §8): forwarding rules source -> dest, per-source FIFO.

Forwarding is :meth:`Routers.forward`, a synchronous step the server schedules after
commits, so a source append never waits on it. Copies are derived
(docs/semantics/topics.md §8.1): a dest journals only the seq ceilings its copies take,
never the copies, so a source append costs one WAL write whatever the fan-out. A
a seal writes the dests' copies and snapshots the router cursors in one cut; after a
crash each router re-derives, from its cursor, the copies made since. Definitions are
control frames.

``at_least_once``: a reader of dest who saw a copy made after the last seal
sees it again, at a new seq, after a crash. ``exactly_once`` copies carry an
idempotency key in ``meta._topics_router``; recovery resumes past the last key it
finds in dest, so dest never holds a source record twice, and readers can tell a
re-derived copy from a new record by its key.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, cast

import msgspec
import orjson

from ..protocol import ConfigPatch, RouterFilter, RouterOut
from .deletion import TagMatch
from .errors import ErrorCode, TopicError
from .journal import RouterDefinition, RouterFrame
from .origin import Derived
from .records import EncodedRecord, check_topic_name, wire_body
from .results import DiffResult

if TYPE_CHECKING:
    from .chunk import Chunk
    from .topic import Topic
    from .topiclog import TopicLog

log = logging.getLogger(__name__)

# A router on a cycle stops forwarding a record after this many hops, so a cycle terminates.
HOP_CAP = 8
AT_LEAST_ONCE, EXACTLY_ONCE = "at_least_once", "exactly_once"
GUARANTEES = (AT_LEAST_ONCE, EXACTLY_ONCE)
ROUTER_KEY = "_topics_router"  # the key exactly_once copies carry (docs/semantics/topics.md §8.2)
# Recovery looks this far back from dest's head for an exactly_once router's last key.
RESUME_SCAN = 100_000
# A dest refusing these holds the cursor (docs/semantics/topics.md §8.4): record_too_large is a
# page bigger than a discard:"reject" dest's whole cap, which is retried record by record.
PUSHBACK = (ErrorCode.TOPIC_FULL, ErrorCode.RECORD_TOO_LARGE, ErrorCode.STORAGE_UNAVAILABLE)

Admits = Callable[[str | None, str | None], bool]


def parse_filter(wire: Any) -> dict[str, Any] | None:
    """Check a router filter and return its normal form (what is stored and compared).

    ``{"tag": <a deletion match: "X", ["tag","Eq","X"], ["tag","Glob","P"]>,
    "node": [ids to forward], "not_node": [ids never to forward]}``, every key optional;
    a record is forwarded when it passes all the keys given. A record without a tag
    fails a tag filter.
    """
    if wire is None:
        return None
    keys = {"tag", "node", "not_node"}
    if not isinstance(wire, dict) or not wire or set(wire) - keys:
        raise TopicError(ErrorCode.INVALID_REQUEST,
                         'filter is an object with "tag", "node" and/or "not_node"',
                         {"filter": wire})  # fmt: skip
    out: dict[str, Any] = {}
    if "tag" in wire:
        match = TagMatch.parse(wire["tag"])
        out["tag"] = match.wire()
    for key in ("node", "not_node"):
        if key in wire:
            ids = wire[key]
            if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
                raise TopicError(ErrorCode.INVALID_REQUEST,
                                 f"filter.{key} is a non-empty list of node ids",
                                 {"filter": wire})  # fmt: skip
            out[key] = sorted(set(ids))
    return out


def compile_filter(normal: dict[str, Any] | None) -> Admits | None:
    if normal is None:
        return None
    match = TagMatch.parse(normal["tag"]) if "tag" in normal else None
    only = frozenset(normal.get("node", ()))
    never = frozenset(normal.get("not_node", ()))

    def admits(node: str | None, tag: str | None) -> bool:
        if match is not None and (tag is None or not match.matches(tag)):
            return False
        if only and node not in only:
            return False
        return node not in never

    return admits


class RouterEntry(msgspec.Struct):
    """A router in the catalog: :class:`Router`'s fields, in its order (the keys on
    disk); a new field goes last, with a default."""

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
    cursor: int
    trimmed: int = 0
    filter: dict[str, Any] | None = None


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
    cursor: int  # the last source seq forwarded (or skipped: filtered, trimmed, hop-capped)
    trimmed: int = 0  # source records evicted before they were forwarded (in memory)
    filter: dict[str, Any] | None = None  # the normal form of parse_filter

    def definition(self) -> tuple[object, ...]:
        return (self.source, self.dest, self.preserve_node, self.preserve_tag,
                self.allow_cycle, self.guarantee, self.filter)  # fmt: skip

    def out(self) -> RouterOut:
        """The router as the API reports it."""
        return RouterOut(
            name=self.name,
            source=self.source,
            dest=self.dest,
            preserve_node=self.preserve_node,
            preserve_tag=self.preserve_tag,
            filter=None if self.filter is None else msgspec.convert(self.filter, RouterFilter),
            allow_cycle=self.allow_cycle,
            guarantee=self.guarantee,
            created_ts=self.created_ts,
            cursor=self.cursor,
            source_trimmed=self.trimmed,
        )

    def key_prefix(self) -> str:
        """``meta._topics_router`` of a copy is this plus ``"<source seq>]"``."""
        return orjson.dumps([self.name, self.source, self.source_epoch]).decode()[:-1] + ","


@dataclass(frozen=True, slots=True)
class Forwarded:
    copies: int  # records appended to dests
    pending: bool  # some router has more to forward, or is held back by dest backpressure
    blocked: bool  # a dest refused with topic_full: retry later


class Routers:
    def __init__(self, engine: TopicLog) -> None:
        self._engine = engine
        self._routers: dict[str, Router] = {}
        # Hop counts of copies made by routers on a cycle: (topic, epoch, seq) -> hops.
        # In memory only (docs/semantics/topics.md §8.5): after a restart recopied records start
        # again from 0.
        self._hops: dict[tuple[str, int, int], int] = {}
        # Names of the routers on a directed cycle; None once the router set changed.
        self._on_cycle: frozenset[str] | None = None

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
        guarantee: str = AT_LEAST_ONCE,
        create_dest: bool = True,
        record_filter: Any = None,
    ) -> tuple[Router, bool]:
        """Create a router (or return the identical existing one); returns (router, created)."""
        check_topic_name(name)
        check_topic_name(source)
        check_topic_name(dest)
        if guarantee not in GUARANTEES:
            raise TopicError(ErrorCode.INVALID_REQUEST,
                             "guarantee is at_least_once or exactly_once",
                             {"guarantee": guarantee})  # fmt: skip
        normal_filter = parse_filter(record_filter)
        if source == dest:
            raise TopicError(ErrorCode.ROUTER_CYCLE, "a router cannot forward a topic to itself",
                             {"cycle": [source, source]})  # fmt: skip
        existing = self._routers.get(name)
        wanted = (source, dest, preserve_node, preserve_tag, allow_cycle, guarantee, normal_filter)
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
                engine.kernel.existing(topic)
        # Lazily created endpoints (docs/semantics/topics.md §8.6): an empty config patch takes the
        # defaults.
        for topic in (source, dest):
            if topic not in engine.kernel:
                engine.put_topic(topic, ConfigPatch())
        src, dst = engine.kernel.existing(source), engine.kernel.existing(dest)
        router = Router(name, source, dest, preserve_node, preserve_tag, allow_cycle, guarantee,
                        engine.clock.now_ms(), src.epoch, dst.epoch, src.head_seq,
                        filter=normal_filter)  # fmt: skip
        engine.kernel.write(source, RouterFrame(name, RouterDefinition(**asdict(router))).encode())
        self._routers[name] = router
        self._on_cycle = None
        return router, True

    def has_routers(self) -> bool:
        return bool(self._routers)

    def sources(self) -> set[str]:
        """The topics some router reads."""
        return {router.source for router in self._routers.values()}

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
        self._engine.kernel.write(router.source, RouterFrame(name, None).encode())
        del self._routers[name]
        self._on_cycle = None

    def topic_dropped(self, name: str, epoch: int) -> None:
        """A topic instance is gone: so are the routers touching it (docs/semantics/topics.md §8.6).
        Called on the live path and on replay, where the epochs keep a later instance's routers."""
        for router in list(self._routers.values()):
            if (router.source, router.source_epoch) == (name, epoch) or (
                router.dest, router.dest_epoch) == (name, epoch):  # fmt: skip
                del self._routers[router.name]
                self._on_cycle = None

    def _cyclic(self) -> frozenset[str]:
        """The routers on a directed cycle: they carry hop counts, whatever their own
        allow_cycle. A cycle is admitted when its closing router has allow_cycle, but
        the copies go round through every router on it, so all of them must count
        (docs/routers.md)."""
        if self._on_cycle is None:
            self._on_cycle = frozenset(
                r.name for r in self._routers.values() if self._path(r.dest, r.source)
            )
        return self._on_cycle

    def _path(self, start: str, goal: str) -> builtins.list[str] | None:
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
    def forward(self, max_records: int = 1000, source: str | None = None) -> Forwarded:
        """Forward up to ``max_records`` source records per router (of ``source`` only,
        if given), in source order."""
        copies = 0
        pending = blocked = False
        for router in self._routers.values():
            if source is not None and router.source != source:
                continue
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
        page = engine.diff(router.source, router.cursor, limit=limit, touch=False)
        gap = page.tombstone
        if gap is not None:
            # Evicted, expired or lost before it was forwarded: dest readers meet the
            # range as a source_trim tombstone (docs/semantics/topics.md §8.4), never a silent skip.
            # The cursor passes it at once, so a dest pushing back later does not skip it
            # twice.
            n = max(1, gap.missed_estimate)
            engine.skip_derived(router.dest, n, "source_trim")
            router.cursor = gap.gap_to
            router.trimmed += n
            log.warning(
                "router %s: source %s lost %d..%d (%s) before forwarding",
                *(router.name, router.source, gap.gap_from, gap.gap_to, gap.reason),
            )
        source = engine.kernel.existing(router.source, replay=False)
        on_cycle = router.name in self._cyclic()
        copies, hops = self._copies(router, source, page, on_cycle)
        if copies:
            result = engine.append_encoded(
                router.dest, copies, create=False, origin=Derived(router.source)
            )
            if on_cycle:
                epoch = engine.kernel.existing(router.dest, replay=False).epoch
                for seq, hop in zip(result.seqs, hops, strict=True):
                    self._hops[(router.dest, epoch, seq)] = hop
        router.cursor = page.next_from_seq
        if on_cycle:
            self._forget_hops(router.source, source.epoch)
        return len(copies), page.next_from_seq < page.head_seq

    def _copies(
        self, router: Router, source: Topic, page: DiffResult, on_cycle: bool
    ) -> tuple[builtins.list[EncodedRecord], builtins.list[int]]:
        """The copies of a page's records (docs/semantics/topics.md §8.3), and each one's hop
        count."""
        admits = compile_filter(router.filter)
        rebuild = not (router.preserve_node and router.preserve_tag) or (
            router.guarantee == EXACTLY_ONCE)  # fmt: skip
        key_prefix = router.key_prefix()
        copies: list[EncodedRecord] = []
        hops: list[int] = []
        # Set by the first seq (every seq is > -1) before any use.
        chunk, base, last = cast("Chunk", None), 0, -1
        for seq in page.seqs:
            if seq > last:  # the page's records, chunk by chunk: one lookup per chunk
                # The page was just read, so its records are live: slot finds them.
                chunk, _ = cast("tuple[Chunk, int]", source.slot(seq))
                base, last = chunk.base_seq, chunk.last_seq
                nodes, tags = chunk.node_names.names, chunk.tag_names.names
            i = seq - base
            node = nodes[chunk.node[i]] or None
            tag = tags[chunk.tag[i]] or None
            if admits is not None and not admits(node, tag):
                continue
            hop = 0
            if on_cycle:
                hop = self._hops.get((router.source, source.epoch, seq), 0)
                if hop >= HOP_CAP:
                    continue
            # A slot is '{"$seq":S,"$ts":T' + body + ','; the body is what a copy keeps.
            run = chunk.slice(i, i + 1)
            body = run[run.index(b",", run.index(b',"$ts":') + 7) : -1]
            if rebuild:
                # Strings in a body are escaped, so these markers are the keys themselves.
                at_data = body.index(b',"data":')
                at_meta = body.find(b',"meta":', 0, at_data)
                data = body[at_data + 8 : -1]
                meta_json = body[at_meta + 8 : at_data] if at_meta >= 0 else b""
                if router.guarantee == EXACTLY_ONCE:
                    meta = orjson.loads(meta_json) if meta_json else {}
                    meta[ROUTER_KEY] = f"{key_prefix}{seq}]"
                    meta_json = orjson.dumps(meta)
                node = node if router.preserve_node else None
                tag = tag if router.preserve_tag else None
                copy = EncodedRecord(wire_body(data, node, tag, meta_json),
                                     len(data) + len(meta_json), node, tag, None)  # fmt: skip
            else:
                copy = EncodedRecord(body, int(chunk.size[i]), node, tag, None)
            copies.append(copy)
            hops.append(hop + 1)
        return copies, hops

    def _forget_hops(self, topic: str, epoch: int) -> None:
        """Hop counts are needed until every router out of ``topic`` has passed them."""
        floor = min((r.cursor for r in self._routers.values() if r.source == topic), default=0)
        for key in [k for k in self._hops if k[0] == topic and (k[1] != epoch or k[2] <= floor)]:
            del self._hops[key]

    # --- durability ---------------------------------------------------------------
    def snapshot(self) -> builtins.list[RouterEntry]:
        """Definitions and cursors for the seal catalog."""
        return [RouterEntry(**asdict(r)) for r in self._routers.values()]

    def restore(self, entries: builtins.list[RouterEntry]) -> None:
        for entry in entries:
            router = Router(**msgspec.structs.asdict(entry))
            self._routers[router.name] = router
        self._on_cycle = None

    def replay(self, name: str, definition: RouterDefinition | None) -> None:
        """A router control frame, after the snapshot the catalog restored."""
        if definition is None:
            self._routers.pop(name, None)
        elif name not in self._routers:
            self._routers[name] = Router(**definition.fields())
        self._on_cycle = None

    def settle_replayed(self) -> None:
        """After replay: a router whose endpoint instance is gone does not exist, and an
        exactly_once router resumes past the last copy dest already holds."""
        kernel = self._engine.kernel
        for router in list(self._routers.values()):
            src, dst = kernel.get(router.source), kernel.get(router.dest)
            if src is None or dst is None or (src.epoch, dst.epoch) != (
                router.source_epoch, router.dest_epoch):  # fmt: skip
                del self._routers[router.name]
                self._on_cycle = None
            elif router.guarantee == EXACTLY_ONCE:
                last = last_copied(router, dst)
                if last is not None and last > router.cursor:
                    log.info("router %s: dest holds copies up to source seq %d; resuming "
                             "there, not at %d", router.name, last, router.cursor)  # fmt: skip
                    router.cursor = last


def last_copied(router: Router, dest: Topic) -> int | None:
    """The source seq in the newest copy ``router`` left in ``dest`` (the key check
    of docs/semantics/topics.md §8.2).

    Copies arrive in source order, so the newest key found is the resume point. Only
    the last RESUME_SCAN seqs are searched: the keys are evidence kept in dest, and a
    delete or eviction there removes it (docs/semantics/topics.md §8.2).
    """
    marker = orjson.dumps(router.key_prefix())[:-1]  # as the key's start appears in JSON
    for seq in range(dest.head_seq, max(dest.front, dest.head_seq - RESUME_SCAN) - 1, -1):
        found = dest.slot(seq)
        if found is None:
            continue
        chunk, i = found
        run = chunk.slice(i, i + 1)
        at = run.find(marker)
        if at >= 0:
            digits = run[at + len(marker) : run.index(b"]", at + len(marker))]
            return int(digits)
    return None
