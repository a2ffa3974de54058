"""Pure protocol guards.

Production code and the property-based models in tests/kv call these same
functions, so the models check the guard that ships, not a copy of it.
"""

from __future__ import annotations


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
