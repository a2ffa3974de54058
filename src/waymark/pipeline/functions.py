"""A stage's function applied to a batch of input records, in its two forms
(docs/pipeline.md, "Batch functions").

The per-event form takes one decoded value and yields the values to write. The batch
form, marked with :func:`batch_function`, takes the whole batch as :class:`Events`
and returns either the batch itself or a :meth:`Events.select` of it, whose records
go on as the encoded bytes they came as (nothing decoded, nothing encoded), or a
list of exactly one value per input record. Either way output ``k`` of input record
``e`` gets the id ``output_event(e, stage, k)`` and ``e``'s position as its origin
(docs/semantics/pipeline.md §5.1): the two forms deliver the same records for the
same mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from waymark.pipeline.batch import InFlight

from .errors import PipelineError

_encode = msgspec.json.encode
_decode = msgspec.json.decode

BATCH_MARK = "__waymark_batch__"  # the attribute batch_function sets

F = TypeVar("F", bound=Callable[..., Any])


def batch_function(function: F) -> F:
    """Mark ``function`` as taking a stage's input a batch at a time (:class:`Events`)."""
    setattr(function, BATCH_MARK, True)
    return function


def is_batch(function: Callable[..., Any]) -> bool:
    return getattr(function, BATCH_MARK, False) is True


class Events:
    """A stage's input batch as a batch function sees it: decoded only when asked."""

    __slots__ = ("_at", "_records", "_values")

    def __init__(self, records: InFlight, at: npt.NDArray[np.intp] | None = None) -> None:
        self._records = records
        self._at = at  # indices into records; None: all of them
        self._values: list[Any] | None = None

    def __len__(self) -> int:
        return len(self._records) if self._at is None else len(self._at)

    def __repr__(self) -> str:
        return f"Events({len(self)} records)"

    def _picked(self, items: list[Any]) -> list[Any]:
        return items if self._at is None else [items[i] for i in self._at.tolist()]

    def values(self) -> list[Any]:
        """Each record's value, decoded (once: later calls return the same list)."""
        if self._values is None:
            self._values = list(map(_decode, self.raw()))
        return self._values

    def raw(self) -> list[bytes]:
        """Each record's value as its JSON bytes."""
        return self._picked(self._records.values())

    def ids(self) -> list[str]:
        """Each record's event id."""
        return self._picked(self._records.event_ids())

    def select(self, indices: Iterable[int]) -> Events:
        """The records at ``indices`` (increasing, each within the batch), to return
        as they came: a filter that decodes and encodes nothing it keeps."""
        at = np.fromiter(indices, np.intp)
        n = len(self)
        if len(at) and (int(at[0]) < 0 or int(at[-1]) >= n or bool((np.diff(at) <= 0).any())):
            raise ValueError(f"select takes increasing indices below {n}")
        return Events(self._records, at if self._at is None else self._at[at])


class RecordError(PipelineError):
    """The function failed on record ``index`` of the batch (its error is the cause);
    the stage names the record's event in its ``StageFunctionFailed``."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


def apply(function: Callable[..., Any], records: InFlight, stage: bytes) -> InFlight:
    """``function`` (either form) over ``records``: the outputs, each with its id and
    origin (``stage`` as it reads inside a JSON string); raises :class:`RecordError`
    naming the record it failed on."""
    if is_batch(function):
        return _apply_batch(function, records, stage)
    args = list(map(_decode, records.values()))
    data: list[bytes] = []
    source: list[int] = []  # the input record of each output
    i = 0
    try:  # one guard for the batch: the loop's i names the record that failed
        for i, arg in enumerate(args):
            for out in function(arg):
                data.append(_encode(out))
                source.append(i)
    except Exception as error:  # the user's code: any failure is this record's
        raise RecordError(i) from error
    # each output's origin and birth are its input record's, taken as columns
    return records.outputs(data, source, stage)


def _apply_batch(function: Callable[[Events], Any], records: InFlight, stage: bytes) -> InFlight:
    """The batch form over ``records``. When the call fails (or returns what it cannot),
    each record is given to it alone, to name the one it fails on; if none fails alone,
    their outputs are the batch's."""
    try:
        return _once(function, records, stage)
    except Exception:  # the user's code: find the record it fails on
        singles = InFlight.empty()
        for i in range(len(records)):
            try:
                singles += _once(function, records.between(i, i + 1), stage)
            except Exception as error:
                raise RecordError(i) from error
        return singles


def _once(function: Callable[[Events], Any], records: InFlight, stage: bytes) -> InFlight:
    events = Events(records)
    got = function(events)
    if isinstance(got, Events):
        if got._records is not records:  # noqa: SLF001 -- its own class
            raise TypeError("a batch function returns its Events, a select() of them, or a "
                            "list of one value per record")  # fmt: skip
        return records.passed(got._at)  # noqa: SLF001
    if not isinstance(got, list):
        raise TypeError(f"a batch function returns its Events, a select() of them, or a list "
                        f"of one value per record, not {type(got).__name__}")  # fmt: skip
    if len(got) != len(records):
        raise ValueError(f"a batch function returned {len(got)} values for {len(records)} "
                         "records: one per record")  # fmt: skip
    return records.outputs([_encode(value) for value in got], range(len(got)), stage)
