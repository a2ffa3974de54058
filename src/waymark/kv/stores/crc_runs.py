"""Check the CRC-32 of every record of a run of equal-length records in bulk.

The append log stores a CRC-32 per record (``crc:u32 ++ body``, the CRC over the
body). Checking a million 60-byte records one ``crc32`` call at a time costs
~0.1 s of CPU in call overhead alone, while one call over the same 64 MB takes
~5 ms. CRC-32 is affine over GF(2), so the CRC of a whole run follows from the
stored per-record CRCs *if they are all right*:

* ``crc(a ++ b) = S[len b](crc a) ^ crc b``, ``S[k]`` the linear map
  "append k zero bytes" (zlib's ``crc32_combine``);
* a record ``c ++ x`` whose stored ``c`` equals ``crc(x)`` has
  ``crc(c ++ x) = S[len x](crc(c as 4 bytes)) ^ c``: an affine function ``h`` of
  ``c`` alone.

A :class:`_Plan` (one per record length, :func:`plan_for`) computes what the
run's CRC must be from the stored fields (table lookups, vectorised with numpy)
and compares it with one ``crc32`` over the run's bytes. The difference is a
linear function of the per-record mismatches ``crc(x_i) ^ c_i``, each multiplied
by an invertible shift, so a run with exactly one bad record always fails, and
several bad records pass only if their mismatches cancel (2^-32 for unrelated
damage). A run that fails is then
read record by record, which names the first bad one (torn tail or corruption):
the bulk check only ever says "all good" or "look closer". Why that is enough
for an export's verification: docs/semantics/kv.md §9.2.
"""

from __future__ import annotations

import threading

import numpy as np
from isal.isal_zlib import crc32

CHUNK = 64
"""Records per first-level block (the position tables hold this many shifts)."""


def _tables(cols: np.ndarray) -> np.ndarray:
    """The (..., 4, 256) byte tables of GF(2) linear maps given by their 32 columns
    (``cols`` of shape (..., 32)): ``f(v) = T[0][v & 255] ^ T[1][v >> 8 & 255] ^
    T[2][v >> 16 & 255] ^ T[3][v >> 24]``. Built by doubling: the entries with bit
    ``i`` set are those without it, XOR column ``i``."""
    c = cols.reshape(*cols.shape[:-1], 4, 8)
    t = np.zeros((*cols.shape[:-1], 4, 1), dtype=np.uint32)
    for i in range(8):
        t = np.concatenate((t, t ^ c[..., i : i + 1]), axis=-1)
    return t


def _apply(tables: np.ndarray, v: np.ndarray) -> np.ndarray:
    v = v.astype(np.uint32)
    return (
        tables[0][v & 255]
        ^ tables[1][(v >> 8) & 255]
        ^ tables[2][(v >> 16) & 255]
        ^ tables[3][v >> 24]
    )


def _shift_cols(nbytes: int) -> np.ndarray:
    """Columns of ``S[nbytes]``: ``crc32(zeros, v) ^ crc32(zeros, 0)`` is linear in ``v``."""
    zeros = bytes(nbytes)
    base = crc32(zeros, 0)
    return np.array([crc32(zeros, 1 << i) ^ base for i in range(32)], dtype=np.uint32)


def shift(v: int, nbytes: int) -> int:
    """``S[nbytes](v)``, for one value."""
    zeros = bytes(nbytes)
    return crc32(zeros, v) ^ crc32(zeros, 0)


def _powers(step_cols: np.ndarray, base: np.ndarray, count: int) -> np.ndarray:
    """``S^j(base)`` for ``j < count``, ``S`` the map with columns ``step_cols``: by
    doubling (``S^L`` applied to the first ``L`` rows gives the next ``L``)."""
    out, power = base[None, :], step_cols
    while len(out) < count:
        t = _tables(power)
        out = np.concatenate((out, _apply(t, out)))
        power = _apply(t, power)
    return out[:count]


class _Plan:
    """The lookup tables for runs of records of one length (``max_records`` at most).

    ``first[p]``: the map from the stored CRC of the record at position ``p`` of a
    block of :data:`CHUNK` to its share of the block's CRC (shifted past the
    ``CHUNK - 1 - p`` records after it); ``consts[r]``: the constant share of the
    last ``r`` positions. ``second[q]``: the shift of a block's CRC by ``q`` blocks.
    """

    __slots__ = ("consts", "first", "first_at", "second", "second_at")

    def __init__(self, length: int, max_records: int) -> None:
        body = length - 4
        h0 = shift(crc32(bytes(4)), body)  # h(0): crc of a zero field, shifted past the body
        h_cols = np.array(
            [shift(crc32((1 << i).to_bytes(4, "little")), body) ^ (1 << i) ^ h0 for i in range(32)],
            dtype=np.uint32,
        )
        step = _shift_cols(length)
        self.first = _tables(_powers(step, h_cols, CHUNK)[::-1]).ravel()
        shares = _powers(step, np.array([h0], dtype=np.uint32), CHUNK).ravel()
        self.consts = np.concatenate(([0], np.bitwise_xor.accumulate(shares))).astype(np.uint32)
        self.first_at = (np.arange(CHUNK * 4, dtype=np.uint32) * 256).reshape(CHUNK, 4)
        blocks = max(1, max_records // CHUNK)
        identity = np.array([1 << i for i in range(32)], dtype=np.uint32)
        self.second = _tables(_powers(_shift_cols(CHUNK * length), identity, blocks)).ravel()
        # Where block j of the last ``m`` blocks looks up its shift by m - 1 - j blocks:
        # the tail of a descending list (first index of each byte's table).
        self.second_at = (np.arange(blocks - 1, -1, -1, dtype=np.uint32) * 1024)[:, None] + (
            np.arange(4, dtype=np.uint32) * 256
        )

    def holds(self, region: memoryview, n: int, length: int) -> bool:
        """Whether every one of the ``n`` records of ``length`` bytes (this plan's) that
        ``region`` holds back to back carries the CRC-32 of its body in its first 4
        bytes (little-endian). False means at least one does not (a True despite
        damage to several records has a 2^-32 chance)."""
        fields = np.frombuffer(region, dtype=np.uint8, count=n * length).reshape(n, length)[:, :4]
        blocks, rest = divmod(n, CHUNK)
        whole = 0
        if blocks:
            idx = fields[: blocks * CHUNK].reshape(blocks, CHUNK, 4) + self.first_at
            per_block = np.bitwise_xor.reduce(self.first[idx], axis=(1, 2)) ^ self.consts[CHUNK]
            # Block j of ``blocks`` is followed by blocks - 1 - j more blocks.
            b = per_block.astype("<u4").view(np.uint8).reshape(blocks, 4)
            at = self.second_at[len(self.second_at) - blocks :] + b
            whole = int(np.bitwise_xor.reduce(self.second[at], axis=None))
        if rest:
            whole = shift(whole, rest * length)
            idx = fields[blocks * CHUNK :] + self.first_at[CHUNK - rest :]
            whole ^= int(np.bitwise_xor.reduce(self.first[idx], axis=None)) ^ int(self.consts[rest])
        return whole == crc32(region[: n * length])


PLAN_MIN_RECORDS = 512
"""Records a run needs before a plan is built for its record length: a plan takes
~1.5 ms, what checking ~10,000 records one by one takes; a cached plan pays from
the first run of its length on."""
_MAX_PLANS = 32
"""Plans kept (~0.8 MB each): the record lengths a log's runs come in."""
_plans: dict[tuple[int, int], _Plan] = {}
_plans_lock = threading.Lock()


def plan_for(length: int, n: int, max_records: int) -> _Plan | None:
    """The plan that checks runs of ``n`` records of ``length`` bytes (``length > 4``,
    ``n <= max_records``) in bulk; None where checking them one by one is cheaper (no
    plan for that length yet, and too short a run to build one)."""
    key = (length, max_records)
    with _plans_lock:
        plan = _plans.get(key)
    if plan is not None or n < PLAN_MIN_RECORDS:
        return plan
    plan = _Plan(length, max_records)
    with _plans_lock:
        if len(_plans) >= _MAX_PLANS:
            del _plans[next(iter(_plans))]  # the oldest
        _plans[key] = plan
    return plan
