"""The routes of the exactly-once sink's writers: open a run, stage, publish.

* ``POST /v0/writers`` ``{writer}`` -> ``{writer, epoch}``: a new run of a writer; its
  epoch fences every earlier run (409 ``fenced``).
* ``POST /v0/topics/{topic}/stage``: one chunk of one task attempt's records,
  invisible to readers until published.
* ``POST /v0/topics/{topic}/publish``: the named parts as one atomic append;
  idempotent per ``(writer, batch_id)``.
* ``GET /v0/writers`` -> ``{writers: [...]}``: every writer's epoch and, per topic, its
  last published batch (what the console's Writers page shows).
"""

from __future__ import annotations

from typing import Annotated, Generic, TypeVar

from msgspec import Meta, Struct

from .limits import NonNegative

Records = TypeVar("Records")
Data = TypeVar("Data")

WriterId = Annotated[str, Meta(min_length=1, max_length=255)]


class OpenWriterRequest(Struct, forbid_unknown_fields=True):
    """``POST /v0/writers``: start a new run of ``writer`` (one epoch for all its topics)."""

    writer: WriterId


class OpenWriterResponse(Struct):
    writer: str
    epoch: int


class StageRequest(Struct, Generic[Records, Data], forbid_unknown_fields=True,
                   omit_defaults=True):  # fmt: skip
    """``POST /v0/topics/{topic}/stage``: chunk ``chunk`` of one task attempt's rows.

    The records come in one of two forms, exactly one of them given:

    * ``records``: a JSON array of RecordIn objects. The server decodes
      ``StageRequest[list[RecordIn], ...]``; a sender whose records are already encoded
      sends the array as one ``msgspec.Raw`` value (the same bytes).
    * ``data`` with ``lengths``, for records that carry data alone: the JSON array of
      their data values (record i is ``{"data": data[i]}``) and each value's length in
      bytes as sent, base64 of little-endian uint32s. The server refuses (400
      ``invalid_request``) an array that does not split into values of exactly those
      lengths, so a sender that joined its rows' values into the array knows each row
      became one record without parsing them itself (docs/spark.md, "Exactly-once
      topic sink").
    """

    writer: WriterId
    epoch: NonNegative
    batch_id: NonNegative
    partition: NonNegative
    attempt: NonNegative
    records: Records | None = None
    chunk: NonNegative = 0
    data: Data | None = None
    lengths: str | None = None


class StageResponse(Struct):
    staged: int
    # False when the batch was already published: nothing was stored, nothing need be.
    accepted: bool


class StagedPart(Struct, forbid_unknown_fields=True):
    partition: NonNegative
    attempt: NonNegative
    chunks: NonNegative


class PublishRequest(Struct, forbid_unknown_fields=True):
    """``POST /v0/topics/{topic}/publish``: the successful attempts' parts of a batch."""

    writer: WriterId
    epoch: NonNegative
    batch_id: NonNegative
    parts: list[StagedPart]


class PublishResponse(Struct):
    """Seqs ``first_seq .. first_seq+count-1``; ``replayed`` when published before."""

    first_seq: int
    count: int
    head_seq: int
    replayed: bool  # the batch had been published before; nothing was appended now


class WriterTopic(Struct):
    """One topic a writer published to (or staged for): its last published batch."""

    topic: str
    # The highest batch id in the publish ledger and its seqs; None before a publish.
    last_batch_id: int | None
    first_seq: int  # 0 with count 0: nothing published (or an empty batch)
    count: int
    staged_parts: int  # task attempts' outputs staged and not yet published


class WriterState(Struct):
    writer: str
    epoch: int  # the current run; stages and publishes of older epochs are fenced
    topics: list[WriterTopic]


class WriterList(Struct):
    writers: list[WriterState]
