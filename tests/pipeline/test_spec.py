"""Spec validation (docs/pipeline.md, "Checking a pipeline file"): every mistake of
issue #24 is one line naming where it is, through ``waymark pipeline check`` and
``run`` as a user calls them, and never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from waymark.pipeline import output_event
from waymark.pipeline.identity import NAME, PipelineIdentity
from waymark.pipeline.spec import PipelineSpec, SpecError
from waymark.protocol.limits import MAX_ID_LENGTH

WAYMARK = str(Path(sys.executable).parent / "waymark")

GOOD = """
[pipeline]
name = "clicks"
handoff = "file:///tmp/clicks-handoff"
servers = ["http://127.0.0.1:1", "http://127.0.0.1:2"]

[[edge]]
name = "raw"
capacity = 1000

[[stage]]
name = "produce"
function = "waymark.pipeline.demo:produce"
events = 10
output = "raw"

[[stage]]
name = "sink"
function = "waymark.pipeline.demo:deliver"
input = "raw"
sink = { url = "http://127.0.0.1:3", topic = "out" }
"""


def spec_with(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


BAD = {
    "a stage without a name": (
        spec_with('name = "produce"\n', ""),
        "[[stage]] #1: name is required",
    ),
    "a misspelled key": (
        spec_with("capacity = 1000", "capacty = 1000"),
        "[[edge]] 'raw': unknown key 'capacty'; did you mean 'capacity'?",
    ),
    "a misspelled table key": (
        spec_with('servers = ["', 'server = ["'),
        "[pipeline]: unknown key 'server'; did you mean 'servers'?",
    ),
    "events that are not a number": (
        spec_with("events = 10", 'events = "ten"'),
        "[[stage]] 'produce': events: expected `int | null`, got `str`",
    ),
    "a negative batch": (
        spec_with("events = 10", "events = 10\nbatch = -5"),
        "[[stage]] 'produce': batch: expected `int` >= 1",
    ),
    "a batch above a page": (
        spec_with("events = 10", "events = 10\nbatch = 20000"),
        "[[stage]] 'produce': batch: expected `int` <= 10000",
    ),
    "a capacity below the batch": (
        spec_with("events = 10", "events = 10\nbatch = 5000"),
        "[[edge]] 'raw': capacity 1000 is below the batch 5000 of its producer 'produce'",
    ),
    "a duplicate stage": (
        GOOD + '\n[[stage]]\nname = "sink"\nfunction = "m:f"\nevents = 1\noutput = "raw"\n',
        "[[stage]] 'sink' is declared twice",
    ),
    "a function typo": (
        spec_with("demo:produce", "demo:produc"),
        "[[stage]] 'produce': cannot load waymark.pipeline.demo:produc: AttributeError",
    ),
    "a batch function as a source's": (
        spec_with("demo:produce", "demo:deliver"),
        "[[stage]] 'produce': waymark.pipeline.demo:deliver is a batch function; a source's "
        "function takes an event number",
    ),
    "a missing module": (
        spec_with("waymark.pipeline.demo:produce", "nowhere.at_all:produce"),
        "[[stage]] 'produce': cannot load nowhere.at_all:produce: ModuleNotFoundError",
    ),
    "an edge nobody declared": (
        spec_with('output = "raw"', 'output = "rwa"'),
        "[[stage]] 'produce': output: no [[edge]] named 'rwa'; did you mean 'raw'?",
    ),
    "an edge named twice in one output list": (
        spec_with('output = "raw"', 'output = ["raw", "raw"]'),
        "[[stage]] 'produce': output names an edge twice",
    ),
    "an output list with an undeclared edge": (
        spec_with('output = "raw"', 'output = ["raw", "rwa"]'),
        "[[stage]] 'produce': output: no [[edge]] named 'rwa'; did you mean 'raw'?",
    ),
    "a name a topic cannot hold": (
        spec_with('name = "clicks"', 'name = "click stream"'),
        "[pipeline]: name: expected a string matching",
    ),
    "no handoff": (
        spec_with('handoff = "file:///tmp/clicks-handoff"\n', ""),
        "[pipeline]: handoff is required",
    ),
    "not TOML": ("[pipeline\n", "Expected ']'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_each_mistake_is_one_line_naming_where_it_is(tmp_path: Path, case: str) -> None:
    text, expected = BAD[case]
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as refused:
        PipelineSpec.load(path)
    message = str(refused.value)
    assert expected in message and "\n" not in message, message


def test_a_function_next_to_the_spec_imports_without_pythonpath(tmp_path: Path) -> None:
    package = tmp_path / "myapp_spec_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "stages.py").write_text("def produce(n):\n    return {'n': n}\n")
    path = tmp_path / "p.toml"
    path.write_text(spec_with("waymark.pipeline.demo:produce", "myapp_spec_test.stages:produce"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([WAYMARK, "pipeline", "check", str(path), "--json"], cwd="/",
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    topology = json.loads(done.stdout)
    assert topology["stages"]["produce"]["function"] == "myapp_spec_test.stages:produce"
    assert topology["edges"]["raw"] == {"candidates": ["http://127.0.0.1:1", "http://127.0.0.1:2"],
                                        "capacity": 1000, "consumer": "sink"}  # fmt: skip


def test_check_and_run_print_one_line_and_exit_2_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(spec_with("demo:produce", "demo:produc"))
    for command in ("check", "run", "status"):
        done = subprocess.run([WAYMARK, "pipeline", command, str(path)], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr + done.stdout
        assert done.stderr.strip() == (
            f"{path}: [[stage]] 'produce': cannot load waymark.pipeline.demo:produc: "
            "AttributeError: module 'waymark.pipeline.demo' has no attribute 'produc'; "
            "did you mean waymark.pipeline.demo:produce?"
        )


def test_the_longest_names_keep_record_ids_within_the_servers_limit() -> None:
    # docs/pipeline.md, "Reruns and neighbours": 32-character names, the largest event
    # number, three stages that fan out, a large generation: still a valid record id.
    name = "n" * 32
    assert NAME.fullmatch(name) and not NAME.fullmatch(name + "n")
    identity = PipelineIdentity(pipeline=name, run="0123456789ab")
    event = identity.event(name, 2**63 - 1)
    for _ in range(3):
        event = output_event(event, name, 999)
    assert len(f"{event}@{2**31}") <= MAX_ID_LENGTH
