"""The ``waymark`` data source's options, named like Spark's Kafka connector's
(docs/spark.md, "Options").

Strict: an option this query does not take fails it when Spark creates the reader
or writer, with the close matches named (a typo of ``maxOffsetsPerTrigger`` is not
silently a query without a limit). Names are case-insensitive, as Spark's are: Spark
hands a Python data source its options with lower-cased keys. The older names stay
as aliases; an option given under both names must not disagree.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping

URL, TOKEN, CA_FILE, SERVER_BUDGET = "url", "token", "caFile", "serverBudgetMs"
SUBSCRIBE, SUBSCRIBE_PATTERN = "subscribe", "subscribePattern"
EDGE, HANDOFF, STAGE, STORE_BUDGET = "edge", "handoff", "stage", "storeBudgetMs"
STARTING, ENDING = "startingOffsets", "endingOffsets"
MAX_PER_TRIGGER, MIN_PER_TRIGGER = "maxOffsetsPerTrigger", "minOffsetsPerTrigger"
MAX_TRIGGER_DELAY = "maxTriggerDelay"
MIN_PARTITIONS, MAX_PER_PARTITION = "minPartitions", "maxRecordsPerPartition"
NODE, FAIL_ON_DATA_LOSS, GAPS_TOPIC = "node", "failOnDataLoss", "gapsTopic"
TOPIC, WRITER_ID, BATCH_ID = "topic", "writerId", "batchId"
CHECKPOINT = "checkpointLocation"  # Spark passes the query's to a streaming sink

# alias -> (option, how the alias's value reads as the option's)
ALIASES: dict[str, tuple[str, dict[str, str] | None]] = {
    "topics": (SUBSCRIBE, None),
    "maxRecordsPerTrigger": (MAX_PER_TRIGGER, None),
    "onDataLoss": (FAIL_ON_DATA_LOSS, {"fail": "true", "skip": "false"}),
}

_READ = {URL, TOKEN, CA_FILE, SERVER_BUDGET, SUBSCRIBE, SUBSCRIBE_PATTERN, STARTING, MIN_PARTITIONS,
         MAX_PER_PARTITION, NODE, FAIL_ON_DATA_LOSS, GAPS_TOPIC}  # fmt: skip
STREAM_SOURCE = frozenset(_READ | {EDGE, HANDOFF, STAGE, STORE_BUDGET, MAX_PER_TRIGGER,
                                   MIN_PER_TRIGGER, MAX_TRIGGER_DELAY})  # fmt: skip
BATCH_SOURCE = frozenset(_READ | {ENDING})
EDGE_SOURCE = frozenset({EDGE, HANDOFF, STAGE, STORE_BUDGET, TOKEN, CA_FILE, MAX_PER_TRIGGER,
                         MIN_PARTITIONS, MAX_PER_PARTITION, FAIL_ON_DATA_LOSS})  # fmt: skip
STREAM_SINK = frozenset({URL, TOKEN, CA_FILE, SERVER_BUDGET, TOPIC, WRITER_ID, CHECKPOINT})
BATCH_SINK = frozenset({URL, TOKEN, CA_FILE, SERVER_BUDGET, TOPIC, WRITER_ID, BATCH_ID})

# Options of Spark's Kafka connector that waymark has no counterpart for: say so.
KAFKA_ONLY = {
    "assign": "a waymark topic has no partitions: use 'subscribe'",
    "kafka.bootstrap.servers": "the server is option 'url'",
    "startingTimestamp": "waymark offsets are seqs: use 'startingOffsets'",
    "startingOffsetsByTimestamp": "waymark offsets are seqs: use 'startingOffsets'",
    "endingTimestamp": "waymark offsets are seqs: use 'endingOffsets'",
    "endingOffsetsByTimestamp": "waymark offsets are seqs: use 'endingOffsets'",
    "includeHeaders": "a record's meta is always the 'meta' column",
    "groupIdPrefix": "the source keeps no server-side consumer group",
    "kafka.group.id": "the source keeps no server-side consumer group",
}

_ROLE = {
    STREAM_SOURCE: "the waymark streaming source (readStream)",
    BATCH_SOURCE: "the waymark batch source (read)",
    EDGE_SOURCE: "the waymark source reading a pipeline edge",
    STREAM_SINK: "the waymark streaming sink (writeStream)",
    BATCH_SINK: "the waymark batch sink (write)",
}
_STREAM_ONLY = {MAX_PER_TRIGGER, MIN_PER_TRIGGER, MAX_TRIGGER_DELAY, EDGE, HANDOFF, STAGE,
                STORE_BUDGET, "maxRecordsPerTrigger"}  # fmt: skip


def resolve(options: Mapping[str, str], allowed: frozenset[str]) -> dict[str, str]:
    """The options keyed by their names as documented, aliases folded into their
    option; ``ValueError`` naming an option ``allowed`` does not hold, with close
    matches, or an option given twice (under its name and an alias) with two values."""
    known = {name.lower(): name for name in allowed}
    aliases = {a.lower(): (a, *spec) for a, spec in ALIASES.items() if spec[0] in allowed}
    out: dict[str, str] = {}
    given_as: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        if low in known:
            name = known[low]
        elif low in aliases:
            alias, name, values = aliases[low]
            if values is not None:
                value = values.get(value.strip().lower(), value)
            key = alias
        else:
            raise ValueError(_unknown(key, allowed))
        if name in out and out[name] != value:
            raise ValueError(
                f"option {name!r} is given twice with two values: {given_as[name]}="
                f"{out[name]!r} and {key}={value!r} ({key!r} is an alias of {name!r})"
            )
        out[name], given_as[name] = value, key
    return out


def _unknown(key: str, allowed: frozenset[str]) -> str:
    role = _ROLE.get(allowed, "the waymark data source")
    kafka = {k.lower(): (k, why) for k, why in KAFKA_ONLY.items()}
    if key.lower() in kafka:
        name, why = kafka[key.lower()]
        return f"option {name!r} of Spark's Kafka connector has no waymark counterpart: {why}"
    names = sorted(allowed | {a for a, (o, _) in ALIASES.items() if o in allowed})
    if allowed is BATCH_SOURCE and key.lower() in {n.lower() for n in _STREAM_ONLY}:
        return f"option {key!r} applies to streaming queries (readStream), not to {role}"
    if allowed is STREAM_SOURCE and key.lower() == ENDING.lower():
        return f"option {ENDING!r} applies to batch queries (read), not to {role}"
    close = _close(key, names)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown option {key!r} for {role}{hint} (it takes: {', '.join(names)})"


def _close(key: str, names: Collection[str]) -> list[str]:
    by_lower = {n.lower(): n for n in names}
    return [by_lower[m] for m in difflib.get_close_matches(key.lower(), by_lower, n=3, cutoff=0.6)]


def flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"option {name!r} is true or false, not {value!r}")
    return text == "true"


def positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = options.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"option {name!r} is a positive integer, not {value!r}")
    return number


def milliseconds(options: Mapping[str, str], name: str, default_ms: int) -> int:
    """A number of milliseconds, 0 or more (``storeBudgetMs``, ``serverBudgetMs``)."""
    value = options.get(name, str(default_ms))
    if not value.isdigit():
        raise ValueError(f"option {name!r} is a number of milliseconds, not {value!r}")
    return int(value)


_UNITS_MS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
             "d": 86_400_000}  # fmt: skip
_DURATION = re.compile(r"\s*(\d+)\s*([a-z]*)\s*")


def duration_ms(options: Mapping[str, str], name: str, default_ms: int) -> int:
    """A duration as Kafka's ``maxTriggerDelay`` takes it: ``15m``, ``30s``, ``500ms``,
    ``1h``, ``1d``; a bare number is milliseconds."""
    value = options.get(name)
    if value is None:
        return default_ms
    match = _DURATION.fullmatch(value.lower())
    if match is None or match.group(2) not in (*_UNITS_MS, ""):
        raise ValueError(f"option {name!r} is a duration like 15m, 30s or 500ms, not {value!r}")
    return int(match.group(1)) * _UNITS_MS.get(match.group(2), 1)
