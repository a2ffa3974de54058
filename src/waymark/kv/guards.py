"""Pure protocol guards.

Production code and the property-based models in tests/kv call these same
functions, so the models check the guard that ships, not a copy of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


def resume_window_ok(revision: int, first_sequence: int) -> bool:
    """Whether resuming after ``revision`` misses nothing.

    A resume reads ``revision + 1`` onward, so it is sound iff the stream still
    holds that sequence. NATS never errors on a start below its head: it clamps
    silently to ``first_sequence``, skipping evicted delete markers. This check
    is ours to make.
    """
    return first_sequence <= revision + 1


def resume_within_stream(revision: int, last_sequence: int) -> bool:
    """Whether ``revision`` can belong to this stream at all.

    A cursor beyond the last sequence means the bucket was recreated; NATS
    would silently deliver nothing until the new stream caught up.
    """
    return revision <= last_sequence


def reset_resume_point(delivered: int, handed: int) -> int:
    """The revision a recreated watch consumer resumes after (docs/semantics/kv.md).

    The last one handed over to the reader, not the last one delivered by the
    old consumer: what was delivered but not handed over was dropped with the
    old consumer, and a resume after it would skip it without a trace.
    """
    return handed


def listing_stuck(listed: int, listing: int) -> bool:
    """Whether an idle heartbeat finds a last-per-subject listing stuck (docs/semantics/kv.md §4.4).

    The consumer was created owing ``listing`` messages and delivered ``listed``. An
    idle heartbeat before all came means some were removed (purged, evicted) after
    the consumer listed them: nats-server then skips one such message per wake-up (a
    write, a heartbeat), so the listing would crawl on for hours without an error.
    """
    return listed < listing


def delivery_is_gap(frontier: int, delivered: int) -> bool:
    """Whether a delivery on an All-scope resume watch skipped sequences.

    Only then does the floor guard need ``first_sequence`` to decide whether
    the skipped sequences were overwrites (benign) or evictions (loss).
    """
    return delivered > frontier + 1


def fallback_may_start(resync_acknowledged: bool) -> bool:
    """Whether the state-sync re-list may start after a cursor-expired resync.

    Only once the main loop has run every synthetic delete through apply and
    the store: a synthetic delete that landed after the re-list put for the
    same key would delete a key that was recreated during the gap.
    """
    return resync_acknowledged


@dataclass(frozen=True, slots=True)
class PointerState:
    """What a pointer swap observed before deciding: absent, or present with a rank.

    ``rank`` is the published artifact's cursor, or None when the pointer does
    not parse (corrupt). Used only by :func:`pointer_publish_allowed`; never stored.
    """

    present: bool
    rank: int | None = None


POINTER_ABSENT = PointerState(False)


def pointer_publish_allowed(current: PointerState, candidate_rank: int) -> bool:
    """Whether a candidate artifact may replace the pointer: the monotonic pointer guard
    (docs/semantics/kv.md §11.2).

    An open slot or a corrupt pointer may be replaced (a corrupt pointer must
    not wedge the fleet); a parseable one only by a candidate at or above its
    rank, so the published cursor never regresses and a slow exporter gets
    SupersededByNewer instead.
    """
    if not current.present or current.rank is None:
        return True
    return candidate_rank >= current.rank


def payload_prunable(
    payload_rank: int | None, pointer_rank: int, is_pointer_target: bool, aged_out: bool
) -> bool:
    """Whether a payload may be deleted: the prune guard (docs/semantics/kv.md §11.4).

    Only a payload that is not the pointer's target, has aged past the grace,
    and whose rank is known and *strictly* below the pointer's. Strictly:
    :func:`pointer_publish_allowed` refuses only candidates below the pointer,
    and the pointer never moves down, so a payload deleted by this rule can
    never be published afterwards; an equal-rank payload still could be.
    """
    return (
        not is_pointer_target
        and aged_out
        and payload_rank is not None
        and payload_rank < pointer_rank
    )


def kept_payloads(
    ranks: Mapping[str, int | None], pointer_rank: int, target: str, keep: int
) -> frozenset[str]:
    """The payloads pruning keeps whatever their age (``--keep N``;
    docs/semantics/kv.md §11.4): the pointer's ``target`` and the newest ``keep - 1``
    other *restorable* ones.

    Restorable: its rank known, of the pointer's generation (the rank's high bits,
    ``ExportManifest.order``) and at or below the pointer (one above it is a round
    still in flight, or an orphan that was never published). ``ranks`` maps every
    payload to its rank (None: unreadable).
    """
    generation = pointer_rank >> 64
    restorable = sorted(
        (rank, name)
        for name, rank in ranks.items()
        if name != target and rank is not None and rank >> 64 == generation
        and rank <= pointer_rank
    )  # fmt: skip
    newest = restorable[max(len(restorable) - (keep - 1), 0) :] if keep > 1 else []
    return frozenset([target, *(name for _, name in newest)])
