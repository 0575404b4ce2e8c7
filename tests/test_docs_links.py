"""The documentation holds together: README.md and every docs/*.md link only to files that exist and to
headings those files have (anchors as GitHub makes them from a heading), name only repository files and
procurd modules that exist, and every document under docs/ can be reached from README.md. README.md stays a
front door that keeps the two commands of its quick start.

Pure file reading: no network, no daemon, no import of procurd.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SOURCE = ROOT / "src"

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
# [text](target) and ![alt](target), with an optional title; the text may hold one level of brackets.
INLINE_LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^\s()<>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
LINK_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# A repository path named in the text: it starts with one of the repository's top-level folders.
REPOSITORY_PATH = re.compile(
    r"(?<![\w./~-])((?:src|tests|benchmarks|scripts|deploy|docs|systemd|\.ci)/[\w.@/-]*[\w/])"
)
# A dotted name of procurd's package, as the docs write modules (`procurd.core.pricing`).
MODULE = re.compile(r"(?<![\w./-])(procurd(?:\.[a-z_][a-z0-9_]*)+)(?![\w-])")
# File names that look like module names: `procurd.toml`, `procurd.service`, `deploy/grafana/procurd.json`.
FILE_SUFFIXES = {"toml", "service", "json", "yaml", "yml", "md", "png", "txt", "log"}


def documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT))


@dataclass(frozen=True)
class Block:
    """A stretch of a document between blank lines, outside fenced code: where links and code spans live."""

    line: int
    text: str


@dataclass(frozen=True)
class Document:
    path: Path
    blocks: tuple[Block, ...]
    fenced: tuple[Block, ...]
    headings: tuple[str, ...]


@cache
def read(path: Path) -> Document:
    blocks: list[Block] = []
    fenced: list[Block] = []
    headings: list[str] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    paragraph: list[str] = []
    start = 0
    fence: str | None = None
    for number, line in enumerate(lines, start=1):
        if fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            else:
                fenced.append(Block(number, line))
            continue
        opening = FENCE.match(line)
        if opening is not None or not line.strip():
            if paragraph:
                blocks.append(Block(start, "\n".join(paragraph)))
                paragraph = []
            if opening is not None:
                fence = opening.group(1)
            continue
        heading = ATX_HEADING.match(line)
        if heading is not None:
            headings.append(heading.group(2) or "")
        if not paragraph:
            start = number
        paragraph.append(line)
    if paragraph:
        blocks.append(Block(start, "\n".join(paragraph)))
    return Document(path, tuple(blocks), tuple(fenced), tuple(headings))


# --- anchors as GitHub makes them ---------------------------------------------------------------------------


def rendered_text(heading: str) -> str:
    """A heading's text as GitHub renders it: code spans keep their content, links their text, images and
    HTML tags nothing, emphasis markers and backslash escapes go."""
    spans: list[str] = []

    def keep(match: re.Match[str]) -> str:
        content = match.group(2).replace("\n", " ")
        if content.startswith(" ") and content.endswith(" ") and content.strip():
            content = content[1:-1]
        spans.append(content)
        return f"\x00{len(spans) - 1}\x00"

    text = CODE_SPAN.sub(keep, heading)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)
    text = text.replace("*", "")
    text = re.sub(r"(?<![^\W_])_+|_+(?![^\W_])", "", text)
    return re.sub("\x00(\\d+)\x00", lambda match: spans[int(match.group(1))], text).strip()


def slug(text: str) -> str:
    """GitHub's slug of a rendered heading: lower case, every character but letters, marks, numbers,
    connectors (``_``), spaces and hyphens dropped, each space a hyphen."""
    kept = (
        character
        for character in text.lower()
        if character.isalnum()
        or character in " -"
        or unicodedata.category(character) == "Pc"
        or unicodedata.category(character).startswith("M")
    )
    return "".join(kept).replace(" ", "-")


def slugs(headings: tuple[str, ...] | list[str]) -> list[str]:
    """The anchors of a document's headings, in order: a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    anchors: list[str] = []
    for heading in headings:
        original = anchor = slug(rendered_text(heading))
        while anchor in seen:
            seen[original] += 1
            anchor = f"{original}-{seen[original]}"
        seen[anchor] = 0
        anchors.append(anchor)
    return anchors


def anchors(path: Path) -> set[str]:
    return set(slugs(read(path).headings))


# --- links --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    document: Path
    line: int
    text: str
    target: str

    def __str__(self) -> str:
        return f"{shown(self.document)}:{self.line}: [{' '.join(self.text.split())}]({self.target})"


def without_code(text: str) -> str:
    return CODE_SPAN.sub(lambda match: " " * len(match.group(0)), text)


def links(path: Path) -> Iterator[Link]:
    for block in read(path).blocks:
        prose = without_code(block.text)
        for match in INLINE_LINK.finditer(prose):
            line = block.line + prose.count("\n", 0, match.start())
            yield Link(path, line, block.text[match.start(2) : match.end(2)], match.group(3))
        for match in LINK_DEFINITION.finditer(prose):
            line = block.line + prose.count("\n", 0, match.start())
            yield Link(path, line, "", match.group(1))


def local_target(link: Link) -> tuple[Path, str] | None:
    """The file a relative link points at and its anchor ("" for none); None for a link to elsewhere."""
    if SCHEME.match(link.target):
        return None
    path, _, anchor = link.target.partition("#")
    file = (link.document.parent / unquote(path)).resolve() if path else link.document
    return file, unquote(anchor)


def problem(link: Link) -> str | None:
    local = local_target(link)
    if local is None:
        return None
    file, anchor = local
    if not link.target or link.target == "#":
        return "an empty target"
    if not file.is_relative_to(ROOT):
        return "points outside the repository"
    if not file.exists():
        return f"{shown(file)} does not exist"
    if anchor:
        if file.suffix != ".md":
            return f"an anchor into {shown(file)}, which has no headings"
        if anchor not in anchors(file):
            return f"{shown(file)} has no heading whose anchor is #{anchor}"
    return None


def test_github_anchors() -> None:
    """The anchors this test expects are GitHub's: the slugs GitHub gives these headings."""
    assert slugs(
        [
            "From `[provider]` to a downstream's first delivered order",
            "Limits, and callbacks an operator can see and replay",
            "1. Crash test",
            "The `mirror_skus` table, *in short*",
            "[The sandbox](sandbox.md) upstream",
            "What’s new? (v2.0)",
            "Prix et délais",
            "Reading",
            "Reading",
            "Reading-1",
            "procurd_provider_requests_total{account}",
        ]
    ) == [
        "from-provider-to-a-downstreams-first-delivered-order",
        "limits-and-callbacks-an-operator-can-see-and-replay",
        "1-crash-test",
        "the-mirror_skus-table-in-short",
        "the-sandbox-upstream",
        "whats-new-v20",
        "prix-et-délais",
        "reading",
        "reading-1",
        "reading-1-1",
        "procurd_provider_requests_totalaccount",
    ]


def test_every_link_and_anchor_resolves() -> None:
    """Every relative link and image of README.md and docs/*.md names a file of the repository, and every
    #anchor a heading of the document it points into."""
    broken = [f"{link}: {why}" for path in documents() for link in links(path) if (why := problem(link))]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_files_and_modules_the_docs_name_exist() -> None:
    """A repository path (`tests/test_cluster.py`, `deploy/grafana/procurd.json`) or a procurd module
    (`procurd.core.pricing`) named anywhere in the docs, code blocks included, exists."""
    missing: list[str] = []
    for path in documents():
        document = read(path)
        for block in (*document.blocks, *document.fenced):
            for match in REPOSITORY_PATH.finditer(block.text):
                if not (ROOT / match.group(1)).exists():
                    line = block.line + block.text.count("\n", 0, match.start())
                    missing.append(f"{shown(path)}:{line}: {match.group(1)} does not exist")
            for match in MODULE.finditer(block.text):
                if not module_exists(match.group(1)):
                    line = block.line + block.text.count("\n", 0, match.start())
                    missing.append(f"{shown(path)}:{line}: {match.group(1)} is no module of procurd")
    assert not missing, "\n".join(missing)


def module_exists(name: str) -> bool:
    """``procurd.a.b`` is a module or package under src/, or a name defined or imported in one."""
    parts = name.split(".")
    if parts[-1] in FILE_SUFFIXES:
        return True
    for length in range(len(parts), 0, -1):
        base = SOURCE.joinpath(*parts[:length])
        module = base.with_suffix(".py") if (base.with_suffix(".py")).is_file() else base / "__init__.py"
        if not module.is_file():
            continue
        rest = parts[length:]
        if not rest:
            return True
        if len(rest) > 1:
            return False
        name = re.escape(rest[0])
        defined = rf"^\s*(?:async def|def|class) {name}\b|\b{name}\b\s*[:=]|^\s*(?:from|import) .*\b{name}\b"
        return re.search(defined, module.read_text(encoding="utf-8"), re.MULTILINE) is not None
    return False


def test_every_document_is_reachable_from_the_readme() -> None:
    """No orphan: following links from README.md reaches every document under docs/."""
    reached = {README}
    waiting = [README]
    while waiting:
        for link in links(waiting.pop()):
            target = (local_target(link) or (ROOT, ""))[0]
            if target.suffix == ".md" and target.is_file() and target not in reached:
                reached.add(target)
                waiting.append(target)
    orphans = [shown(path) for path in documents() if path not in reached]
    assert not orphans, f"not reachable from README.md: {orphans}"


def test_the_readme_is_a_front_door_with_its_two_commands() -> None:
    """README.md stays short (the rest is in docs/) and keeps the quick start's two commands as they are
    run: the one that installs procurd and runs the demo, and the whole test suite."""
    text = README.read_text(encoding="utf-8")
    assert len(text.split("\n")) <= 300
    assert "```sh\npython3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/procurd demo\n```" in text
    assert "```sh\nscripts/test\n```" in text
