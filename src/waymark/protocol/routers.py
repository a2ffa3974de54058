"""The router routes (docs/semantics/topics.md §8): a router forwards every record committed
to ``source``
(that passes its ``filter``) into ``dest``.

* ``PUT /v0/routers/{router}`` :class:`RouterPut` -> :class:`RouterOut` (201 when created).
* ``GET /v0/routers/{router}``, ``DELETE /v0/routers/{router}``, ``GET /v0/routers``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

from .records import TagRule

# Checked by the engine, which answers a bad name with 400 invalid_topic_name.
Name = Annotated[str, Meta(min_length=1, max_length=255)]
Guarantee = Literal["at_least_once", "exactly_once"]


class RouterFilter(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Forward only records passing every key given: a tag match (as in deletes), a
    $node among ``node``, a $node not among ``not_node``."""

    tag: str | TagRule | None = None
    node: Annotated[list[str], Meta(min_length=1)] | None = None
    not_node: Annotated[list[str], Meta(min_length=1)] | None = None


class RouterPut(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``PUT /v0/routers/{router}``: forward every record committed to source into dest."""

    source: Name
    dest: Name
    preserve_node: bool = True
    preserve_tag: bool = True
    allow_cycle: bool = False
    guarantee: Guarantee = "at_least_once"
    create_dest: bool = True
    filter: RouterFilter | None = None


class RouterOut(Struct):
    name: str
    source: str
    dest: str
    preserve_node: bool
    preserve_tag: bool
    filter: RouterFilter | None
    allow_cycle: bool
    guarantee: str
    created_ts: int
    cursor: int  # the last source seq forwarded
    source_trimmed: int  # source records evicted before forwarding (since start-up)


class RouterList(Struct):
    routers: list[RouterOut]


class RouterDeleted(Struct):
    router: str
    deleted: bool
