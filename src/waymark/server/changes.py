"""The change checkpoint source over HTTP (docs/semantics/recovery.md §1):
``GET /v0/changes/checkpoints`` walks them newest first, ``GET /v0/changes/watch``
streams each new one over SSE. Both read the engine's internal checkpoint topic,
whose seqs are the checkpoint ids."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import msgspec

from ..log import CHANGES_TOPIC, DiffResult, Engine, ErrorCode, TopicError
from ..protocol import KeyChange, TombstoneReason, key_topic
from ..protocol.scopes import ScopeKind, allows
from .auth import TOKEN, Token
from .http import Request, Response
from .metrics import Metrics
from .notify import Notifier
from .sse import EventStream

DEFAULT_PAGE = 500
MAX_PAGE = 1000
MAX_INT = 2**63 - 1


class _Data(msgspec.Struct, array_like=True):
    """A stored :class:`~waymark.protocol.CheckpointData` with its changes left as
    bytes: an unfiltered read passes them through, undecoded."""

    time_ms: int
    changes: msgspec.Raw


class _Stored(msgspec.Struct):
    """A record of the checkpoint topic as the engine renders it."""

    seq: int = msgspec.field(name="$seq")
    data: _Data


class _Out(msgspec.Struct, array_like=True):
    """A :class:`~waymark.protocol.Checkpoint` on the wire, its changes as bytes."""

    id: int
    time_ms: int
    changes: msgspec.Raw
    instance: str


class _Page(msgspec.Struct):
    """A :class:`~waymark.protocol.CheckpointPage` on the wire."""

    checkpoints: list[_Out]
    next_before: int | None
    instance: str
    expired_to: int
    older: int


_stored = msgspec.json.Decoder(_Stored)
_changes = msgspec.json.Decoder(list[KeyChange])
_encode = msgspec.json.encode


def _int(request: Request, name: str, default: int) -> int:
    values = request.query.get(name)
    if not values:
        return default
    if not (values[-1].isascii() and values[-1].isdigit()) or int(values[-1]) > MAX_INT:
        raise TopicError(ErrorCode.INVALID_REQUEST, f"{name} is an integer 0 to 2^63-1",
                         {name: values[-1]})  # fmt: skip
    return int(values[-1])


def _topics(request: Request) -> frozenset[str] | None:
    values = request.query.get("topic")
    if not values:
        return None
    return frozenset(t for v in values for t in v.split(",") if t)


def _shown(request: Request) -> Callable[[str], bool] | None:
    """Which topics' changes a request is shown (None: all): those of its ``topic``
    filter (docs/semantics/recovery.md §3.4) that its token may read. A checkpoint
    names each change's topic and key, so a read token of other topics must not see
    them (docs/security.md)."""
    topics = _topics(request)
    token: Token | None = request.scope.get(TOKEN)
    if token is None or any(
        g.kind is ScopeKind.ADMIN or (g.kind is ScopeKind.READ and g.glob == "*")
        for g in token.grants
    ):
        return None if topics is None else topics.__contains__
    readable = partial(allows, token.grants, ScopeKind.READ)
    if topics is None:
        return readable
    return lambda topic: topic in topics and readable(topic)


def _checkpoints(
    result: DiffResult, shown: Callable[[str], bool] | None, instance: str
) -> Iterator[_Out]:
    """The checkpoints of a per-record page, oldest first; ``shown`` keeps only the
    changes of the topics it admits, but every id (docs/semantics/recovery.md §3.4)."""
    for run in result.runs:
        stored = _stored.decode(bytes(run)[:-1])
        changes = stored.data.changes
        if shown is not None:
            kept = [c for c in _changes.decode(changes) if shown(key_topic(c.key))]
            changes = msgspec.Raw(_encode(kept))
        yield _Out(stored.seq, stored.data.time_ms, changes, instance)


class ChangesApi:
    def __init__(
        self, engine: Engine, notifier: Notifier, metrics: Metrics, heartbeat_s: float
    ) -> None:
        self.engine, self.notifier, self.metrics = engine, notifier, metrics
        self.heartbeat_s = heartbeat_s

    def read(self, after: int, limit: int) -> DiffResult:
        if not self.engine.tracks_changes:
            raise TopicError(
                ErrorCode.INVALID_REQUEST,
                "this server keeps no change checkpoints (--checkpoint-interval-s 0)",
            )
        return self.engine.diff(CHANGES_TOPIC, after, limit=limit, per_record=True, touch=False)

    async def list_checkpoints(self, request: Request) -> Response:
        earliest_ms = _int(request, "earliest_ms", 0)
        limit = _int(request, "limit", DEFAULT_PAGE)
        if not 1 <= limit <= MAX_PAGE:
            raise TopicError(ErrorCode.INVALID_REQUEST, f"limit is 1 to {MAX_PAGE}",
                             {"limit": limit})  # fmt: skip
        shown = _shown(request)
        instance = self.engine.instance
        head = self.read(0, 1).head_seq  # (also refuses when no checkpoints are kept)
        low = min(_int(request, "before", head + 1) - 1, head)
        found: list[_Out] = []
        page = None
        # A crash leaves seqs of the checkpoint topic that no checkpoint holds (its
        # ceiling's lead, docs/durability.md), the newest ones too when the restart had
        # nothing to name: a page goes further back until it holds a checkpoint, or
        # ``limit=1`` would answer "none" and a client's newest id would be 0
        # (docs/semantics/recovery.md §1.5).
        while not found and low > 0 and (page is None or low >= page.earliest_seq):
            top, low = low, max(low - limit, 0)
            cursor = low
            while cursor < top:
                # (a read stops before a run of such seqs; the walk goes on past them)
                page = self.read(cursor, top - cursor)
                found += [c for c in _checkpoints(page, shown, instance) if c.id <= top]
                if page.caught_up or page.next_from_seq <= cursor:
                    break
                cursor = page.next_from_seq
        found.reverse()
        kept = [c for c in found if c.time_ms >= earliest_ms]
        # More to walk back only if nothing in this page was too old and seqs remain.
        more = len(kept) == len(found) and page is not None and low >= page.earliest_seq
        # (the read above applied the window: expiry is lazy, docs/semantics/topics.md §5.1)
        expired_to = self.engine.get_topic(CHANGES_TOPIC, touch=False).evict_floor - 1
        older = max((c.id for c in found if c.time_ms < earliest_ms), default=0)
        body = _Page(kept, low + 1 if more and low > 0 else None, instance, expired_to, older)
        return Response(_encode(body))

    async def watch(self, request: Request) -> Response:
        after = _int(request, "after", -1)
        if last_id := request.header(b"last-event-id"):
            value = last_id.decode("latin-1")
            if not (value.isascii() and value.isdigit()) or int(value) > MAX_INT:
                raise TopicError(ErrorCode.INVALID_REQUEST, "Last-Event-ID is a checkpoint id",
                                 {"cursor": value})  # fmt: skip
            after = int(value)
        head = self.read(0, 1).head_seq
        if after < 0:
            after = head  # from the newest on
        elif after < (expired := self.engine.get_topic(CHANGES_TOPIC, touch=False).evict_floor - 1):
            raise _behind(after + 1, expired)
        elif after > head:
            # Ids never go back within one instance: a cursor past the newest one was
            # given by another (a new, replaced or restored data directory). Waiting for
            # this one's ids to pass it would skip its checkpoints without a word
            # (docs/semantics/recovery.md §3.5).
            raise TopicError(
                ErrorCode.INVALID_REQUEST,
                f"checkpoint {after} is past this server's newest, {head}: the cursor is "
                f"from another server instance (this one is {self.engine.instance})",
                {"after": after, "newest": head, "instance": self.engine.instance},
            )
        feed = CheckpointFeed(self, after, _shown(request))
        return EventStream(feed, self.notifier, self.metrics, self.heartbeat_s)


def _behind(first: int, last: int) -> TopicError:
    return TopicError(
        ErrorCode.INVALID_REQUEST,
        f"checkpoints {first} to {last} passed the recovery window before this stream "
        "sent them: query again (the recovery query reports them lost)",
        {"lost": [first, last], "reason": "expired"},
    )


class CheckpointFeed:
    """SSE ``event: checkpoint`` per checkpoint after a cursor; ``id:`` is its id."""

    topic = CHANGES_TOPIC

    def __init__(self, api: ChangesApi, after: int, shown: Callable[[str], bool] | None) -> None:
        self._api, self._cursor, self._shown = api, after, shown

    async def next(self) -> tuple[bytes, bool]:
        page = self._api.read(self._cursor, 100)
        gap = page.tombstone
        if gap is not None and gap.reason != TombstoneReason.LOST:
            # The recovery window took checkpoints this stream had not sent: ending it
            # with the refusal, never passing them silently
            # (docs/semantics/recovery.md §3.6). (A "lost" gap is seqs a crash
            # skipped: they never held one.)
            raise _behind(gap.gap_from, gap.gap_to)
        self._cursor = page.next_from_seq
        parts = [
            b"event: checkpoint\nid: %d\ndata: %b\n\n" % (c.id, _encode(c))
            for c in _checkpoints(page, self._shown, self._api.engine.instance)
        ]
        return b"".join(parts), not page.caught_up

    def due_s(self) -> None:
        return None

    def close(self) -> None:
        pass
