"""A large append's body decoded a piece of records at a time (docs/security.md, Limits).

msgspec decodes a body in one C call, which holds the GIL throughout: a 50 MB append
held every other thread, the event loop's too, for 60-130 ms, although it was decoded
on a worker thread. The body is cut instead into pieces of about ``PIECE_BYTES`` at
record boundaries and each piece is decoded alone, so the worker gives the GIL back
between pieces.

A cut is only a guess: the bytes ``},{"data":`` (else ``},{"``) end a record and
start the next one, but they also occur inside data (an array of objects, a string).
Each piece is decoded as one array nested in another, ``[[piece]]`` (the depth a
record has in the body), and must give exactly one inner array: that holds only if the
piece is a run of whole records — a piece that ends inside a string or a nested value
leaves it unclosed, and one that holds the array's end and more (``],"records":[``
...) gives two arrays or none. Otherwise the next cut is tried. So the pieces together
are exactly the records array, and the result is the one decoding the whole body
gives. Any other shape, or any failure, decodes the whole body in one call, as a small
body is: a refused body is answered with the same error either way.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ..protocol import AppendRequest, RecordIn
from .http import BodyDecoder

PIECE_BYTES = 1 << 20  # about 1 ms of msgspec per piece
HEAD = b'{"records":['  # how every waymark client starts an append's body
# A record's end and the next one's start: waymark's clients write a record's data
# first, which an array of objects inside data seldom matches (each miss is a decode).
_CUT_DATA, _CUT = b'},{"data":', b'},{"'
_TRIES = 16  # cuts tried for one piece before the whole body is decoded instead
_MARK = b'{"data":0}'  # a record standing in for the array while the tail is decoded
# What msgspec raises for a body it refuses (see BodyDecoder).
_REFUSED = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


class AppendDecoder:
    """Decodes ``POST /v0/topics/{topic}/records`` bodies, a large one in pieces."""

    def __init__(
        self,
        piece_bytes: int = PIECE_BYTES,
        check: Callable[[AppendRequest], object] | None = None,
    ) -> None:
        """``check``: called with each decoded body however it was decoded, raising
        what it refuses (as :class:`BodyDecoder`'s)."""
        self.piece_bytes = piece_bytes  # (tests cut small bodies into many pieces)
        self._check = check
        self._whole = BodyDecoder(AppendRequest, check)
        self._piece = msgspec.json.Decoder(list[list[RecordIn]])
        self._rest = msgspec.json.Decoder(AppendRequest)

    def decode(self, body: bytes) -> AppendRequest:
        decoded = None
        if len(body) > 2 * self.piece_bytes and body.startswith(HEAD):
            decoded = self._in_pieces(body)
        if decoded is None:
            return self._whole.decode(body)
        if self._check is not None:
            self._check(decoded)
        return decoded

    def _in_pieces(self, body: bytes) -> AppendRequest | None:
        """The body decoded a piece at a time, or None where it does not split so (or
        is refused: the whole body's decode then says why)."""
        try:
            found = self._tail(body)
            if found is None:
                return None
            end, rest = found
            records: list[RecordIn] = []
            start = len(HEAD)
            while start < end:
                start = self._piece_from(body, start, end, records)
                if start < 0:
                    return None
            return msgspec.structs.replace(rest, records=records)
        except _REFUSED:
            return None

    def _piece_from(self, body: bytes, start: int, end: int, records: list[RecordIn]) -> int:
        """Decode the piece of records that starts at ``start`` into ``records``; where
        the next one starts (``end`` after the last one), or -1 if no cut was found."""
        cut = start + self.piece_bytes
        for _ in range(_TRIES):
            # (searched a piece ahead only: a body whose records start otherwise would
            # have each search scan to its end)
            found = body.find(_CUT_DATA, cut, min(end, cut + self.piece_bytes))
            cut = body.find(_CUT, cut, end) if found < 0 else found
            if cut < 0:  # the last piece: the rest of the array
                records += self._records(body, start, end)
                return end
            try:
                records += self._records(body, start, cut + 1)
                return cut + 2  # past the comma, at the next record's brace
            except _REFUSED:
                cut += 1  # not a boundary of the array (or not valid at all)
        return -1

    def _records(self, body: bytes, start: int, end: int) -> list[RecordIn]:
        """The records ``body[start:end]`` holds, if it is a run of whole records."""
        piece = b"".join((b"[[", memoryview(body)[start:end], b"]]"))  # one copy
        arrays = self._piece.decode(piece)
        if len(arrays) != 1:
            raise msgspec.DecodeError("not a run of records")
        return arrays[0]

    def _tail(self, body: bytes) -> tuple[int, AppendRequest] | None:
        """Where the records array ends (its ``]``), and what follows it decoded (the
        request's other fields, with a stand-in record for the array); None if no
        ``]`` near the end closes it.

        The ``]`` tried are the last ones first, and the first whose rest decodes is
        the array's end once the pieces before it decode as records: a ``]`` further
        left, such that what follows it sets ``records`` again, cannot be the one
        taken, since the ``]`` that ends that second array would have decoded first."""
        end = len(body)
        for _ in range(_TRIES):
            end = body.rfind(b"]", len(HEAD), end)
            if end < 0:
                return None
            try:
                return end, self._rest.decode(b"%b%b]%b" % (HEAD, _MARK, body[end + 1 :]))
            except _REFUSED:
                continue
        return None
