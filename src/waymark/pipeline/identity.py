"""A pipeline's identity: its name and the id of its handoff store, created once and
kept in that store (docs/semantics/pipeline.md §8).

Every edge topic, record id and event id is scoped by it, so a rerun with a fresh
handoff store and a neighbour pipeline with the same edge names on the same servers
never share a topic, nor have their records taken for repeats of each other's.
"""

from __future__ import annotations

import re
import uuid

import msgspec

from waymark.objstore import CREATE, ObjectExists, ObjectNotFound, ObjectStore

from .errors import PipelineError

# Pipeline, stage and edge names: what a topic name takes, without the "." and ":"
# that separate the parts of a scoped name, and short enough that a record id (the
# scope, the source stage, the event number, a segment per fanning-out stage, the
# generation) stays far below the server's MAX_ID_LENGTH (docs/pipeline.md, "Reruns
# and neighbours").
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}"
NAME = re.compile(NAME_PATTERN)
IDENTITY_KEY = "identity.json"


class IdentityError(PipelineError, ValueError):
    """The handoff store belongs to another pipeline."""


class PipelineIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """``pipeline``: the pipeline file's name; ``run``: the handoff store's id (12 hex digits,
    random, written once with a create-only put)."""

    pipeline: str
    run: str

    @property
    def scope(self) -> str:
        """``<pipeline>.<run>``: the prefix of every name this pipeline run makes."""
        return f"{self.pipeline}.{self.run}"

    def edge_topic(self, edge: str) -> str:
        """The topic of ``edge`` on every server it is placed on; the topic is claimed
        for this identity (its ``owner``, docs/semantics/pipeline.md §8.2)."""
        return f"edge.{self.scope}.{edge}"

    def event(self, stage: str, n: int) -> str:
        """The stable id of a source stage's event ``n`` (docs/semantics/pipeline.md §5.1)."""
        return f"{self.scope}/{stage}:{n}"

    def event_prefix(self, stage: str) -> str:
        return f"{self.scope}/{stage}:"


_decoder = msgspec.json.Decoder(PipelineIdentity)


def load_identity(store: ObjectStore) -> PipelineIdentity | None:
    try:
        return _decoder.decode(store.get(IDENTITY_KEY).data)
    except ObjectNotFound:
        return None


def establish(store: ObjectStore, pipeline: str) -> PipelineIdentity:
    """The identity kept in ``store``, created for ``pipeline`` on first use. Two
    starts racing both end with the one that was written first. Raises
    :class:`IdentityError` when the store is another pipeline's."""
    if not NAME.fullmatch(pipeline):
        raise IdentityError(f"pipeline name {pipeline!r} must match {NAME_PATTERN}")
    identity = load_identity(store)
    if identity is None:
        fresh = PipelineIdentity(pipeline=pipeline, run=uuid.uuid4().hex[:12])
        try:
            store.put(IDENTITY_KEY, msgspec.json.encode(fresh), mode=CREATE)
            identity = fresh
        except ObjectExists:
            identity = load_identity(store)
            assert identity is not None  # created meanwhile, never deleted
    if identity.pipeline != pipeline:
        raise IdentityError(
            f"the handoff store belongs to pipeline {identity.pipeline!r}, not {pipeline!r}: "
            "give each pipeline its own handoff store"
        )
    return identity


def identity_of(store: ObjectStore, default: str = "pipeline") -> PipelineIdentity:
    """The identity kept in ``store``, whatever pipeline it names; one named
    ``default`` is created when there is none (edges and stages used without a spec)."""
    identity = load_identity(store)
    return identity if identity is not None else establish(store, default)
