"""The docs stand inside the repository: every citation resolves, nothing points outside.

Code comments and docstrings cite rules as ``docs/semantics/topics.md §5.4`` (a section
number of that page) or ``docs/<page>.md#<anchor>``; the markdown pages link each other
(see docs/semantics/topics.md, "Citing it"). A clone must make sense alone, so this
fails when

(a) a file under src/, tests/ or bench/ cites a "§" section without naming, earlier on
    the same line, a docs/ page that has a heading with that number, or names a path or
    document outside the repository;
(b) a ``docs/<page>.md`` or ``docs/<page>.md#<anchor>`` cited there does not exist, or
    has no heading with that anchor under GitHub's anchor rules;
(c) a relative link, anchor or "§" of README.md or a docs/ page does not resolve, or
    such a page points outside the repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("src", "tests", "bench")
CODE_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".sh", ".yaml", ".yml"}
# This file spells out the patterns it looks for, so it is not scanned itself.
SELF = Path(__file__).resolve()

SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
# A page of docs/ named from code, with an optional anchor: docs/semantics/kv.md#21-...
CODE_DOC = re.compile(r"docs/((?:[\w.-]+/)*[\w.-]+\.md)(?:#([\w-]+))?")
# A markdown link or image: [text](target).
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A page named in markdown prose or code spans: semantics/topics.md, docs/semantics/kv.md.
MD_PAGE = re.compile(r"(?<![\w./-])((?:\.\./|\./)?(?:[\w.-]+/)*[\w.-]+\.md)(?:#([\w-]+))?")
# Paths and documents that exist only outside the repository: the specs this project's
# design started from and the notes beside them.
OUTSIDE = re.compile(
    r"(?<![\w.-])(?:\.\./)*(?:shared|specs)/"
    r"|\bDESIGN\.md\b|\bAPI\.md\b|\bARCHITECTURE(?:\.md)?\b"
    r"|\b(?:topics-semantics|checkpoint-ordering|kv-fold|receipt-recovery|relocatable-pipeline)\b"
)
# "the spec's code", "the specs": a document the reader does not have.
SPEC_PROSE = re.compile(r"\bthe specs?\b|\bspecs?'s?(?=\s)", re.IGNORECASE)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
NUMBERED = re.compile(r"^§?(\d+(?:\.\d+)*)\.?(?:\s|$)")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
FENCE = re.compile(r"^ {0,3}(```|~~~)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text lowercased, punctuation
    other than ``-`` and ``_`` removed, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML renders nothing itself
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@dataclass
class Page:
    """What a markdown page offers to citations: anchors and numbered sections."""

    anchors: set[str] = field(default_factory=set)
    numbers: set[str] = field(default_factory=set)
    number_of: dict[str, str] = field(default_factory=dict)  # anchor -> section number
    repeated: list[str] = field(default_factory=list)  # numbers on more than one heading


def parse_page(text: str) -> Page:
    page = Page()
    seen: dict[str, int] = {}
    for line in prose_lines(text):
        page.anchors.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        title = m.group(2)
        slug = github_slug(title)
        # GitHub numbers repeated headings: foo, foo-1, foo-2.
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchor = slug if n == 0 else f"{slug}-{n}"
        page.anchors.add(anchor)
        if num := NUMBERED.match(title):
            if num.group(1) in page.numbers:
                page.repeated.append(num.group(1))
            page.numbers.add(num.group(1))
            page.number_of[anchor] = num.group(1)
    return page


def prose_lines(text: str) -> list[str]:
    """The lines of a markdown text outside fenced code blocks (others become blank)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return out


@cache
def load_page(path: Path) -> Page | None:
    return parse_page(path.read_text()) if path.is_file() else None


def inside(root: Path, path: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def resolve_section(root: Path, page_path: Path, number: str, where: str) -> list[str]:
    page = load_page(page_path.resolve())
    shown = page_path.resolve()
    if inside(root, page_path):
        shown = shown.relative_to(root.resolve())
    if page is None:
        return [f"{where}: §{number} cites {shown}, which does not exist"]
    if number not in page.numbers:
        return [f"{where}: §{number} is not a numbered heading of {shown}"]
    return []


def resolve_anchor(root: Path, page_path: Path, anchor: str | None, where: str) -> list[str]:
    if not inside(root, page_path):
        return [f"{where}: {page_path} is outside the repository"]
    shown = page_path.resolve().relative_to(root.resolve())
    if not page_path.exists():
        return [f"{where}: {shown} does not exist"]
    if anchor is None or page_path.suffix != ".md":
        return []
    page = load_page(page_path.resolve())
    assert page is not None
    if anchor not in page.anchors:
        return [f"{where}: {shown} has no heading with anchor #{anchor}"]
    return []


def outside_refs(line: str, where: str) -> list[str]:
    found = [m.group(0) for m in OUTSIDE.finditer(line)]
    found += [m.group(0) for m in SPEC_PROSE.finditer(line)]
    return [f"{where}: {text!r} points outside the repository" for text in found]


def code_problems(root: Path, rel: str, text: str) -> list[str]:
    """(a) and (b) for one source, test or bench file."""
    problems: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{lineno}"
        problems += outside_refs(line, where)
        refs = list(CODE_DOC.finditer(line))
        for ref in refs:
            problems += resolve_anchor(root, root / "docs" / ref.group(1), ref.group(2), where)
        for sec in SECTION.finditer(line):
            named = [r for r in refs if r.end() <= sec.start()]
            if not named:
                problems.append(
                    f"{where}: §{sec.group(1)} without a docs/ page named before it on the line"
                )
                continue
            page = root / "docs" / named[-1].group(1)
            problems += resolve_section(root, page, sec.group(1), where)
    return problems


def markdown_problems(root: Path, rel: str, text: str) -> list[str]:
    """(c) for README.md or one page of docs/."""
    problems = [f"{rel}: §{n} numbers two headings" for n in parse_page(text).repeated]
    here = (root / rel).parent
    lines = zip(text.splitlines(), prose_lines(text), strict=True)
    for lineno, (raw, line) in enumerate(lines, 1):
        where = f"{rel}:{lineno}"
        problems += outside_refs(raw, where)
        links = []
        for link in LINK.finditer(line):
            target = link.group(2)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
                continue
            path, _, anchor = target.partition("#")
            page = here / path if path else root / rel
            links.append((link, page))
            problems += resolve_anchor(root, page, anchor or None, where)
        # Where on the line each page is named: a link (its end) or a bare mention.
        named = [(link.end(), page) for link, page in links] + [
            (m.start(), page_in(root, here, m.group(1)))
            for m in MD_PAGE.finditer(line)
            if not any(link.start() <= m.start() < link.end() for link, _ in links)
        ]
        for sec in SECTION.finditer(line):
            number, at = sec.group(1), sec.start()
            around = [(lk, pg) for lk, pg in links if lk.start(1) <= at < lk.end(1)]
            if around:  # [§5.4](semantics/topics.md#54-tombstones): the link's page
                link, page = around[0]
                problems += resolve_section(root, page, number, where)
                anchor = link.group(2).partition("#")[2]
                cited = load_page(page.resolve()) if page.suffix == ".md" else None
                single = len(SECTION.findall(link.group(1))) == 1
                if anchor and single and cited and cited.number_of.get(anchor, number) != number:
                    problems.append(f"{where}: §{number} links to #{anchor}, another section")
                continue
            # Otherwise the page named last before it on the line, else this page.
            before = [(pos, page) for pos, page in named if pos <= at]
            page = max(before, key=lambda named: named[0])[1] if before else root / rel
            problems += resolve_section(root, page, number, where)
    return problems


def page_in(root: Path, here: Path, name: str) -> Path:
    """A page named in markdown: relative to the page, else to the repository root."""
    local = here / name
    return local if local.exists() else root / name


def code_files(root: Path) -> list[Path]:
    files = []
    for d in CODE_DIRS:
        for path in sorted((root / d).rglob("*")):
            if (
                path.is_file()
                and path.suffix in CODE_SUFFIXES
                and "__pycache__" not in path.parts
                and path.resolve() != SELF
            ):
                files.append(path)
    return files


def markdown_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s):\n" + "\n".join(problems)


# --- the repository --------------------------------------------------------------------


def test_code_cites_only_docs_pages_that_resolve() -> None:
    problems: list[str] = []
    for path in code_files(ROOT):
        problems += code_problems(ROOT, str(path.relative_to(ROOT)), path.read_text())
    assert not problems, report(problems)


def test_docs_links_and_sections_resolve_inside_the_repository() -> None:
    problems: list[str] = []
    for path in markdown_files(ROOT):
        problems += markdown_problems(ROOT, str(path.relative_to(ROOT)), path.read_text())
    assert not problems, report(problems)


def test_every_semantics_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in sorted((ROOT / "docs" / "semantics").glob("*.md")):
        assert f"docs/semantics/{page.name}" in readme, page.name


# --- the checks themselves, on a small repository of their own -------------------------


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "semantics").mkdir(parents=True)
    (tmp_path / "docs" / "semantics" / "topics.md").write_text(
        "# Topics\n\n## 5. Tombstones and more\n\n### 5.4 Tombstones\n\n"
        "See §5 and [the guide](../guide.md#usage).\n\n```\n## 9.9 not a heading\n```\n"
    )
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Usage\n\n## Usage\n")
    return tmp_path


@pytest.mark.parametrize(
    "line",
    [
        "# evict first (docs/semantics/topics.md §5.4)",
        "# docs/semantics/topics.md §5, §5.4: both sections",
        "# see docs/guide.md#usage and docs/guide.md#usage-1",
        "# docs/guide.md, Usage",
        "# a store spec like lmdb:PATH; the OpenAPI spec; msgspec",
    ],
)
def test_code_citations_that_resolve_pass(repo: Path, line: str) -> None:
    assert code_problems(repo, "src/x.py", line) == []


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("# evict first (§5.4)", "without a docs/ page"),
        ("# §5.4 of docs/semantics/topics.md", "without a docs/ page"),
        ("# docs/semantics/topics.md §9.9", "not a numbered heading"),
        ("# docs/semantics/nope.md §5.4", "does not exist"),
        ("# docs/guide.md#tombstones", "no heading with anchor #tombstones"),
        ("# docs/missing.md", "does not exist"),
        ("# as ../shared/specs/topics-semantics.txt says", "outside the repository"),
        ("# see specs/kv-fold", "outside the repository"),
        ("# per shared/DESIGN.md", "outside the repository"),
        ('"""Errors, each with the spec\'s code."""', "outside the repository"),
        ("# The spec says so", "outside the repository"),
    ],
)
def test_code_citations_that_do_not_resolve_fail(repo: Path, line: str, complaint: str) -> None:
    problems = code_problems(repo, "src/x.py", line)
    assert problems and any(complaint in p for p in problems), problems


def test_markdown_pages_that_resolve_pass(repo: Path) -> None:
    text = (
        "# Guide\n\nRules: [§5.4](semantics/topics.md#54-tombstones), "
        "[§5](semantics/topics.md), `docs/semantics/topics.md §5.4`, "
        "[usage](#usage), [site](https://example.com/x.md#y).\n"
    )
    assert markdown_problems(repo, "docs/guide.md", text) == []
    assert markdown_problems(repo, "docs/semantics/topics.md",
                             (repo / "docs/semantics/topics.md").read_text()) == []  # fmt: skip


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("A queue (spec §10).", "not a numbered heading of docs/guide.md"),
        ("[§5.4](semantics/topics.md#5-tombstones-and-more)", "another section"),
        ("[rules](semantics/topics.md#missing)", "no heading with anchor #missing"),
        ("[gone](semantics/gone.md)", "does not exist"),
        ("[up](../../outside.md)", "outside the repository"),
        ("It follows `specs/checkpoint-ordering`.", "outside the repository"),
        ("the ceiling `shared/DESIGN.md` cites", "outside the repository"),
        ("[§9.9](semantics/topics.md)", "not a numbered heading"),
        ("## 1. One\n\n## 1. Two", "§1 numbers two headings"),
    ],
)
def test_markdown_that_does_not_resolve_fails(repo: Path, text: str, complaint: str) -> None:
    problems = markdown_problems(repo, "docs/guide.md", f"# Guide\n\n{text}\n")
    assert problems and any(complaint in p for p in problems), problems


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The demo — `./run demo`", "the-demo--run-demo"),
        ("5.4 Tombstones", "54-tombstones"),
        ("10. Queues", "10-queues"),
        ("5.3 CommittedMonotonic", "53-committedmonotonic"),
        ("Fold sink — `foreachBatch(FoldSink(...))`", "fold-sink--foreachbatchfoldsink"),
        ("Cursor authority of `watch_applied`", "cursor-authority-of-watch_applied"),
        ("See [the guide](x.md) *now*", "see-the-guide-now"),
    ],
)
def test_github_slug(heading: str, anchor: str) -> None:
    assert github_slug(heading) == anchor


def test_repeated_headings_get_numbered_anchors() -> None:
    page = parse_page("# A\n## Usage\n## Usage\n```\n## Usage\n```\n")
    assert page.anchors == {"a", "usage", "usage-1"}
