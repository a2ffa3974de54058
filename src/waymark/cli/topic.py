"""``waymark topic list|describe|create|config|delete|drop``: topics from the shell, in
the habits of ``rpk topic`` (docs/cli.md, "Data commands"; the fields are those of
docs/http-api.md, "Topics")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from waymark.cli.connect import (
    DEFAULT_URL,
    Ca,
    Json,
    Token,
    Url,
    client,
    print_fields,
    print_json,
    print_table,
)
from waymark.cli.errors import Failure

if TYPE_CHECKING:
    from waymark.client import Client, ConfigPatch, TopicState
    from waymark.protocol import TagRule

Topic = Annotated[str, typer.Argument(help="The topic's name.", show_default=False)]
Settings = Annotated[
    list[str] | None,
    typer.Option(
        "--config",
        "-c",
        show_default=False,
        help="KEY=VALUE of the topic's config, e.g. cap_records=1000 or discard=reject "
        "(docs/topics.md, Configuration); repeat for several.",
    ),
]


def config_patch(settings: Sequence[str]) -> ConfigPatch:
    """``KEY=VALUE`` pairs as a :class:`ConfigPatch`. A value is read as JSON when it
    is JSON (``1000``, ``true``, ``null``), else as a string (``reject``)."""
    import msgspec

    from waymark.client import ConfigPatch

    fields: dict[str, object] = {}
    for setting in settings:
        key, eq, text = setting.partition("=")
        if not eq or not key:
            raise typer.BadParameter(f"{setting!r} is not KEY=VALUE", param_hint="--config")
        try:
            fields[key] = msgspec.json.decode(text)
        except msgspec.DecodeError:
            fields[key] = text
    try:
        return msgspec.convert(fields, ConfigPatch)
    except msgspec.ValidationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from exc


def tag_match(tag: str) -> str | TagRule:
    """A tag given on the command line as the API's match: with a wildcard (``*``,
    ``?``, ``[``) the match ``Glob`` (docs/globs.md), anything else the tag itself."""
    from waymark.protocol.globs import is_glob

    return ("tag", "Glob", tag) if is_glob(tag) else tag


def _config_fields(state: TopicState) -> list[tuple[str, object]]:
    import msgspec

    # The queue fields are UNSET (absent from the JSON) on a log topic.
    return [
        (k, v) for k, v in msgspec.structs.asdict(state.config).items() if v is not msgspec.UNSET
    ]


def _show(state: TopicState, json: bool) -> None:
    """A topic's state: counts and watermarks, then its config."""
    if json:
        print_json(state)
        return
    fields: list[tuple[str, object]] = [
        ("name", state.name),
        ("type", state.type.value),
        ("epoch", state.epoch),
        ("head_seq", state.head_seq),
        ("earliest_seq", state.earliest_seq),
        ("evict_floor", state.evict_floor),
        ("count", state.count),
        ("bytes", state.bytes),
        ("durability", state.durability.value),
        ("effective_priority", state.effective_priority),
        ("created_ts", state.created_ts),
        ("last_write_ts", state.last_write_ts),
        ("last_read_ts", state.last_read_ts),
    ]
    if state.queue is not None:
        q = state.queue
        fields += [
            ("queue.ready", q.ready),
            ("queue.in_flight", q.in_flight),
            ("queue.dead_lettered", q.dead_lettered),
        ]
    if state.recovering:
        fields.append(("recovering", True))
    fields += [(f"config.{k}", v) for k, v in _config_fields(state)]
    print_fields(f"topic {state.name}", fields)


def register(app: typer.Typer) -> None:
    topic = typer.Typer(
        help="Topics: list, describe, create, configure, delete records, drop.",
        no_args_is_help=True,
    )
    app.add_typer(topic, name="topic")

    @topic.command("list")
    def list_(
        url: Url = DEFAULT_URL, token: Token = None, ca: Ca = None, json: Json = False
    ) -> None:
        """Every topic the token may read, by name."""
        with client(url, token, ca) as c:
            topics = c.list_topics()
        if json:
            print_json(topics)
            return
        print_table(
            "topics",
            ["name", "type", "count", "bytes", "earliest_seq", "head_seq", "durability"],
            [
                (
                    t.name,
                    t.type.value,
                    t.count,
                    t.bytes,
                    t.earliest_seq,
                    t.head_seq,
                    t.durability.value,
                )
                for t in topics
            ],
        )

    @topic.command()
    def describe(
        name: Topic, url: Url = DEFAULT_URL, token: Token = None, ca: Ca = None, json: Json = False
    ) -> None:
        """A topic's state and config. Reading it does not count as consumption."""
        with client(url, token, ca) as c:
            _show(c.get_topic(name, touch=False), json)

    @topic.command()
    def create(
        name: Topic,
        type_: Annotated[
            str, typer.Option("--type", help="log, or queue (docs/queues.md); never changes.")
        ] = "log",
        settings: Settings = None,
        url: Url = DEFAULT_URL,
        token: Token = None,
        ca: Ca = None,
        json: Json = False,
    ) -> None:
        """Create topic NAME (exit 5, refused, if it exists).

        An existing topic's config is left as it was: `topic config` changes it."""
        from waymark.client import TopicType

        try:
            kind = TopicType(type_)
        except ValueError as exc:
            raise typer.BadParameter("log or queue", param_hint="--type") from exc
        patch = config_patch(settings or [])
        with client(url, token, ca) as c:
            if _exists(c, name):
                raise Failure(f"topic {name} exists — `waymark topic config` changes it")
            state, _ = c.put_topic(name, patch, type=kind)
        _show(state, json)

    @topic.command()
    def config(
        name: Topic,
        settings: Annotated[
            list[str] | None,
            typer.Argument(help="KEY=VALUE to set; none: print the config.", show_default=False),
        ] = None,
        url: Url = DEFAULT_URL,
        token: Token = None,
        ca: Ca = None,
        json: Json = False,
    ) -> None:
        """Print topic NAME's config, or set the KEY=VALUE given (others keep theirs)."""
        with client(url, token, ca) as c:
            # First a read, which refuses a missing topic (404 topic_not_found): a PUT
            # would create it, and `config` only changes an existing one.
            state = c.get_topic(name, touch=False)
            if settings:
                state, _ = c.put_topic(name, config_patch(settings))
        if json:
            print_json(state.config)
            return
        print_fields(f"topic {name} config", _config_fields(state))

    @topic.command()
    def delete(
        name: Topic,
        before_seq: Annotated[
            int | None, typer.Option(help="Delete every record below this seq.")
        ] = None,
        tag: Annotated[
            str | None,
            typer.Option(
                help="Delete the records with this tag, or whose tag matches this glob "
                "(*, ?, [...]: docs/globs.md), e.g. 'customer:*'."
            ),
        ] = None,
        url: Url = DEFAULT_URL,
        token: Token = None,
        ca: Ca = None,
        json: Json = False,
    ) -> None:
        """Delete records of topic NAME, permanently (not the topic: see `drop`).

        Those that exist now below --before-seq and/or matching --tag are deleted
        (docs/topics.md, deletion). Readers are not told of deleted records: they are
        gone by request, not lost."""
        if before_seq is None and tag is None:
            raise typer.BadParameter("give --before-seq and/or --tag")
        match = None if tag is None else tag_match(tag)
        with client(url, token, ca) as c:
            result = c.delete(name, before_seq=before_seq, match=match)
        if json:
            print_json(result)
            return
        print_fields(
            f"topic {name}",
            [
                ("deleted", result.deleted),
                ("earliest_seq", result.earliest_seq),
                ("head_seq", result.head_seq),
                ("count", result.count),
                ("bytes", result.bytes),
            ],
        )

    @topic.command()
    def drop(name: Topic, url: Url = DEFAULT_URL, token: Token = None, ca: Ca = None) -> None:
        """Drop topic NAME with its records, tag index and dedupe state.

        Created again, it is a new instance (new epoch, seqs from 1); readers of the
        old one are told (a `recreated` tombstone)."""
        with client(url, token, ca) as c:
            c.delete_topic(name)
        typer.echo(f"dropped topic {name}", err=True)


def _exists(c: Client, name: str) -> bool:
    from waymark.client import ApiError, ErrorCode

    try:
        c.get_topic(name, touch=False)
    except ApiError as exc:
        if exc.code is ErrorCode.TOPIC_NOT_FOUND:
            return False
        raise
    return True
