"""``waymark`` starts light (docs/cli.md, "Start-up"; issue #26): a command loads what
it uses when it runs, never at start, and typer's pydantic only when a value needs
parsing. Checked by the modules a start loads, not by a stopwatch (bench/cli_startup.py
measures the time)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

WAYMARK = str(Path(sys.executable).parent / "waymark")

# What a start must not load: the client (and asyncio, msgspec with it), rich's
# progress bars, the server, and pydantic (typer's value adapters).
HEAVY = ("waymark.client", "waymark.protocol", "waymark.server", "rich.progress", "pydantic",
         "msgspec", "asyncio")  # fmt: skip


def loaded_after(*argv: str) -> set[str]:
    """The top modules loaded once ``waymark ARGV`` ran (in this process, as the
    entry point runs it)."""
    return run_loading(*argv)[0]


def run_loading(*argv: str) -> tuple[set[str], int, str]:
    """``waymark ARGV`` run as the entry point runs it: the modules loaded once it ran,
    its exit code and what it wrote to stderr before."""
    code = (
        "import json, sys\n"
        f"sys.argv = ['waymark', *{list(argv)!r}]\n"
        "from waymark.cli import main\n"
        "try:\n    main()\n    code = 0\n"
        "except SystemExit as exit:\n    code = exit.code if isinstance(exit.code, int) else 1\n"
        "print(json.dumps([code, sorted(sys.modules)]), file=sys.__stderr__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    *before, last = done.stderr.splitlines()
    exit_code, modules = json.loads(last)
    return set(modules), exit_code, "\n".join(before)


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules for h in HEAVY if m == h or m.startswith(h + ".")}


def test_import_help_and_version_load_nothing_heavy() -> None:
    assert heavy(loaded_after("version")) == set()
    assert heavy(loaded_after("--help")) == set()
    assert heavy(loaded_after("recovery", "--help")) == set()


def test_a_data_command_loads_the_client_but_not_pydantic_nor_progress_bars() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    found = heavy(loaded_after("recovery", "clients", "--url", url))
    assert "waymark.client" in found
    assert not {m for m in found if m.split(".")[0] in ("pydantic", "rich")}


def test_values_that_need_parsing_are_still_checked() -> None:
    # An int with bounds, given as text, goes to typer's own check (pydantic).
    for bad in ("0", "many"):
        done = subprocess.run([WAYMARK, "ship", "--url", "http://127.0.0.1:9", "--topic", "t",
                               "--to", "http://127.0.0.1:9", "--in-flight", bad],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 2 and "--in-flight" in done.stderr, done.stderr


def test_a_pipeline_stage_process_starts_without_pydantic(tmp_path: Path) -> None:
    # One process per stage pays its start once per stage: pydantic was a fifth of a
    # `pipeline run SPEC --stage X` start's CPU (the pipeline file's Path and the --stage list
    # went to typer's adapters; docs/pipeline.md, "One process per stage: where the time goes").
    spec = tmp_path / "p.toml"
    spec.write_text(f"""
[pipeline]
name = "start"
handoff = "{(tmp_path / "handoff").as_uri()}"

[[edge]]
name = "raw"
candidates = ["http://127.0.0.1:9"]

[[stage]]
name = "produce"
function = "waymark.pipeline.demo:produce"
events = 10
output = "raw"

[[stage]]
name = "sink"
function = "waymark.pipeline.demo:deliver"
input = "raw"
sink = {{ url = "http://127.0.0.1:9", topic = "out" }}
""")
    # an unknown stage: refused once the runner has the pipeline file and the --stage list
    argv = ("pipeline", "run", str(spec), "--stage", "sink", "--stage", "nope")
    modules, exit_code, stderr = run_loading(*argv)
    assert exit_code == 2 and "no stage 'nope'" in stderr, stderr
    assert "waymark.pipeline.runner" in modules  # it got as far as the runner
    assert not {m for m in modules if m.split(".")[0] == "pydantic"}


def said(output: str) -> str:
    """An error as one line: rich boxes it at the terminal's width and breaks it where
    the path's length puts it (pytest's numbered temp dirs vary in length)."""
    return " ".join(output.replace("│", " ").split())


def test_paths_and_lists_taken_without_pydantic_are_what_typer_makes_of_them(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from waymark.cli.startup import install

    install()
    app, got = typer.Typer(), []

    @app.command()
    def command(
        spec: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
        stage: Annotated[list[str] | None, typer.Option()] = None,
    ) -> None:
        got.append((spec, stage))

    file = tmp_path / "p.toml"
    file.write_text("")
    runner = CliRunner()
    done = runner.invoke(app, [str(file), "--stage", "a", "--stage", "b"])
    assert done.exit_code == 0, done.output
    assert got == [(file, ["a", "b"])] and type(got[0][0]) is type(file)
    # typer's own checks still run on a path taken without its adapter
    done = runner.invoke(app, [str(tmp_path / "missing.toml")])
    assert done.exit_code == 2 and "does not exist" in said(done.output), done.output
    done = runner.invoke(app, [str(tmp_path)])
    assert done.exit_code == 2 and "is a directory" in said(done.output), done.output
