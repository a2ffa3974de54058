"""One glob syntax everywhere (docs/globs.md): token scopes, the tag ``Glob`` of
deletions and router filters, and the console's scope check all match as
``waymark.protocol.globs.glob_matches`` does. Before, a scope was an fnmatch glob, the
console's check knew only ``*`` (``.`` and ``?`` were literal there, ``[`` too), and a
tag ``Glob`` was a literal prefix with one trailing ``*`` (``user:*:eu`` refused)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from waymark.log import Engine, RecordIn, TagMatch
from waymark.log.journal import DeleteFrame
from waymark.log.router import compile_filter, parse_filter
from waymark.protocol.globs import escape, glob_matches, literal_prefix
from waymark.protocol.scopes import Grant, ScopeKind, allows

API_JS = Path(__file__).resolve().parents[2] / "src" / "waymark" / "server" / "ui" / "api.js"

# (pattern, name, matches): the syntax as docs/globs.md states it.
CASES = [
    ("logs.*", "logs.app", True),
    ("logs.*", "logs", False),
    ("logs.*", "logsXapp", False),  # '.' is literal
    ("logs/*", "logs/a/b", True),  # '/' is not special: '*' crosses it
    ("user:*:eu", "user:42:eu", True),
    ("user:*:eu", "user:42:us", False),
    ("job-?", "job-7", True),
    ("job-?", "job-17", False),
    ("[ab]*", "beta", True),
    ("[ab]*", "gamma", False),
    ("[!ab]*", "gamma", True),
    ("[a-c]x", "bx", True),
    ("[]]", "]", True),
    ("a[", "a[", True),  # no closing bracket: a literal '['
    ("Logs.*", "logs.app", False),  # case-sensitive
    ("*", "", True),
    ("[*]", "*", True),
    ("[*]", "x", False),
]


@pytest.mark.parametrize(("pattern", "name", "expected"), CASES)
def test_scopes_tags_and_router_filters_match_by_the_one_syntax(
    pattern: str, name: str, expected: bool
) -> None:
    assert glob_matches(pattern, name) is expected
    assert allows((Grant.parse(f"read:{pattern}"),), ScopeKind.READ, name) is expected
    assert TagMatch.parse(["tag", "Glob", pattern]).matches(name) is expected
    admits = compile_filter(parse_filter({"tag": ["tag", "Glob", pattern]}))
    assert admits is not None and admits(None, name) is expected


def test_a_tag_glob_deletes_exactly_the_matching_tags_through_the_index() -> None:
    """The tag index is scanned from the pattern's literal prefix, then each tag is
    matched: nothing outside the glob goes, nothing inside it stays."""
    log = Engine()
    tags = ["user:1:eu", "user:2:us", "user:3:eu", "user:eu", "users:4:eu", "admin:eu"]
    log.append("t", [RecordIn.of(i, tag=tag) for i, tag in enumerate(tags)])
    log.delete("t", match=TagMatch.parse(["tag", "Glob", "user:?:eu"]))
    left = [r["$tag"] for r in log.diff("t", from_seq=0, limit=100).records()]
    assert left == ["user:2:us", "user:eu", "users:4:eu", "admin:eu"]


def test_journal_frames_keep_their_meaning() -> None:
    """A glob frame carries the pattern; a prefix Glob is written as before; a frame of
    the prefix-only Glob (no ``glob`` field) still means its literal prefix, wildcards
    in it included."""
    match = TagMatch.parse(["tag", "Glob", "u[12]:*"])
    frame = DeleteFrame.of("t", 1, None, match, 10)
    assert frame.selector == match and frame.glob == "u[12]:*"
    prefix = DeleteFrame.of("t", 1, None, TagMatch.parse(["tag", "Glob", "u:*"]), 10)
    assert prefix.match == (False, "u:") and b'"glob"' not in prefix.encode()  # v1 bytes
    old = DeleteFrame("t", 1, None, (False, "a[1"), 10)
    assert old.selector is not None
    assert old.selector.matches("a[1x") and not old.selector.matches("a1x")
    assert literal_prefix("ab?c*") == "ab" and glob_matches(escape("a*[?"), "a*[?")


def _random_cases(count: int) -> list[tuple[str, str]]:
    rng = random.Random(26)  # fixed: the same cases in every run
    pattern_chars, name_chars = "ab.-/*?[]!^", "ab.-/[]!^"
    return [
        ("".join(rng.choice(pattern_chars) for _ in range(rng.randint(0, 6))),
         "".join(rng.choice(name_chars) for _ in range(rng.randint(0, 5))))
        for _ in range(count)
    ]  # fmt: skip


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the console's JS")
def test_the_consoles_glob_matches_as_the_server_does(tmp_path: Path) -> None:
    """The console's ``globMatches`` (api.js) against ``glob_matches`` on the cases
    above and 3000 random ones over the special characters, in one node process."""
    cases = [(p, n) for p, n, _ in CASES] + _random_cases(3000)
    module = tmp_path / "api.mjs"  # node 20 reads ES modules by their extension
    module.write_text(API_JS.read_text())
    script = (
        f"import {{ globMatches }} from {json.dumps(module.as_uri())};\n"
        "let input = ''; process.stdin.on('data', (d) => (input += d));\n"
        "process.stdin.on('end', () => console.log(JSON.stringify("
        "JSON.parse(input).map(([p, n]) => globMatches(p, n)))));\n"
    )
    done = subprocess.run(
        ["node", "--input-type=module", "-e", script], input=json.dumps(cases),
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    got = json.loads(done.stdout)
    wrong = [(p, n, g) for (p, n), g in zip(cases, got, strict=True) if g != glob_matches(p, n)]
    assert not wrong, wrong[:10]
