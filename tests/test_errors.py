"""One exception tree (docs/errors.md): every exception waymark raises is a
``WaymarkError``; a refused request is a ``Refusal`` whether the engine raises it
(``TopicError``) or the client decodes it (``ApiError``), with the same bytes on the wire."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import httpx
import msgspec
import pytest

import waymark
from waymark.client import ApiError, Client, TransportError
from waymark.kv.errors import KvError, SnapshotError, StoreInUse
from waymark.log.errors import TopicError
from waymark.protocol import Error, ErrorCode
from waymark.protocol.errors import Refusal, WaymarkError


def public_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in a waymark module under a public name.

    Warnings are left out: they are issued through :mod:`warnings`, not raised for an
    ``except`` to catch (``DroppedTicketWarning``); so is the command line's own, how a
    command ends (``waymark.cli.errors.Failure``), caught by the CLI itself and never by
    an application, which the CLI's start-up must not pay the protocol's import for
    (tests/cli/test_startup.py)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(waymark.__path__, "waymark."):
        if info.name == "waymark.cli" or info.name.startswith("waymark.cli."):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and not issubclass(value, Warning)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_public_exception_is_a_waymark_error() -> None:
    found = public_exceptions()
    # The walk reaches every package (not vacuous): one root of each is among them.
    for root in ("log.errors.TopicError", "client.errors.ApiError", "kv.errors.KvError",
                 "objstore.types.ObjectStoreError", "checkpoint.errors.CheckpointError",
                 "recovery.types.RecoveryError", "pipeline.errors.PipelineError",
                 "spark.source.WaymarkDataLoss", "server.auth.TokenFileError"):  # fmt: skip
        assert f"waymark.{root}" in found
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, WaymarkError))
    assert outside == []


def test_the_tree_keeps_the_standard_bases_callers_catch() -> None:
    # An application's ``except OSError`` / ``TimeoutError`` / ``ValueError`` still works.
    from waymark.client import TransportTimeout
    from waymark.objstore import InvalidKey
    from waymark.pipeline.spec import SpecError

    assert issubclass(TransportTimeout, TimeoutError) and issubclass(TransportError, OSError)
    assert issubclass(InvalidKey, ValueError) and issubclass(SpecError, ValueError)
    assert issubclass(SnapshotError, KvError) and issubclass(StoreInUse, KvError)


def test_engine_and_client_refusals_are_one_concept_with_the_same_bytes() -> None:
    engine = TopicError(ErrorCode.TOPIC_FULL, "topic t is full", {"cap": 3})
    assert isinstance(engine, Refusal) and engine.status == 422
    wire = msgspec.json.encode(engine.body())
    assert wire == (
        b'{"error":{"code":"topic_full","message":"topic t is full","detail":{"cap":3}}}'
    )
    assert str(engine) == "topic t is full"
    assert repr(engine) == "TopicError(topic_full, 'topic t is full', {'cap': 3})"

    client = ApiError.from_body(engine.status, wire)
    assert isinstance(client, Refusal)
    assert (client.code, client.message, client.detail, client.status) == (
        engine.code, engine.message, engine.detail, engine.status,
    )  # fmt: skip
    assert client.code is ErrorCode.TOPIC_FULL
    assert msgspec.json.encode(client.body()) == wire
    assert str(client) == "422 topic_full: topic t is full"


def test_a_code_this_version_does_not_know_keeps_its_string_and_status() -> None:
    newer = ApiError.from_body(418, b'{"error":{"code":"teapot","message":"m","detail":{}}}')
    assert (newer.code, newer.status) == ("teapot", 418)
    with pytest.raises(ValueError):
        Refusal("teapot", "a foreign code without a status")


def test_an_application_catches_a_server_refusal_as_waymark_error(waymark_server: Any) -> None:
    # Through the shipped client against a real server: the refusal is a WaymarkError,
    # and its body is the server's bytes exactly.
    name = "errors-tree-missing"
    raw = httpx.get(f"{waymark_server.url}/v0/topics/{name}")
    assert raw.status_code == 404
    with Client(waymark_server.url) as client:
        try:
            client.get_topic(name)
        except WaymarkError as error:
            assert isinstance(error, ApiError) and isinstance(error, Refusal)
            assert error.code is ErrorCode.TOPIC_NOT_FOUND and error.status == 404
            assert msgspec.json.encode(error.body()) == raw.content
            assert msgspec.json.decode(raw.content, type=Error).error.code == "topic_not_found"
        else:
            pytest.fail("no refusal")
