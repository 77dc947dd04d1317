"""README.md: its relative links resolve, and it holds the two set-up commands CI runs verbatim.

Reads only files of this repository, found from this file's location (not the working directory).
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: The set-up commands, each on its own line indented by 4 spaces (.ci/run runs the second one).
SETUP_COMMANDS = (
    "pip install . && pycoll bench --ranks 4",
    'pip install -e ".[test]" torch==2.13.0 && python -m pytest -q -ra',
)

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target><[^>\n]*>|[^()\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(?P<title>.+?)[ \t]*#*[ \t]*$", re.M)


def slugify(title: str) -> str:
    """A heading's anchor as MkDocs' toc extension makes it (Python-Markdown's default slugify) from the
    heading's text: inline markup dropped, accents folded to ASCII, punctuation other than hyphens and
    underscores dropped, lowercased, runs of spaces and hyphens made one hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link keeps its text
    text = text.replace("`", "").replace("**", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _without_code_blocks(text: str) -> str:
    """``text`` with fenced code blocks blanked out (line numbers kept): headings there do not count."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _without_code(text: str) -> str:
    """``text`` without fenced blocks and code spans: links there do not count."""
    return _CODE_SPAN.sub("", _without_code_blocks(text))


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (a repeated heading gets _1, _2... as in MkDocs)."""
    seen: set[str] = set()
    for m in _HEADING.finditer(_without_code_blocks(path.read_text(encoding="utf-8"))):
        slug = base = slugify(m.group("title"))
        n = 0
        while slug in seen:
            n += 1
            slug = f"{base}_{n}"
        seen.add(slug)
    return seen


def relative_links(path: Path) -> list[str]:
    """Every link target in a markdown file except web and mail addresses."""
    targets = []
    for m in _LINK.finditer(_without_code(path.read_text(encoding="utf-8"))):
        target = m.group("target").strip("<>")
        if re.match(r"(?i)(https?:|mailto:)", target):
            continue
        targets.append(target)
    return targets


def test_slugify_matches_the_headings_we_link() -> None:
    assert slugify("Build options") == "build-options"
    assert slugify("Several nodes") == "several-nodes"
    assert slugify("Features") == "features"
    assert slugify('compression="auto"') == "compressionauto"
    assert slugify("Errors — nothing hangs, nothing is left behind") == (
        "errors-nothing-hangs-nothing-is-left-behind"
    )
    assert slugify("Diagnosing a machine (`pycoll doctor`)") == "diagnosing-a-machine-pycoll-doctor"
    assert slugify("Tuning: the cost model and `auto`") == "tuning-the-cost-model-and-auto"
    assert slugify("PYCOLL_SECRET") == "pycoll_secret"


def test_slugify_agrees_with_python_markdown_where_installed() -> None:
    toc = pytest.importorskip("markdown.extensions.toc")
    for title in ("Build options", 'compression="auto"', "Errors — nothing hangs, nothing is left behind",
                  "Performance (shared memory, this repository's 2-vCPU development VM)", "PYCOLL_SECRET"):
        assert slugify(title) == toc.slugify(title, "-")


def test_readme_links_resolve() -> None:
    links = relative_links(README)
    assert links, "README.md has no relative links: did the parser break?"
    problems = []
    for target in links:
        file_part, _, anchor = target.partition("#")
        path = README if not file_part else (README.parent / file_part).resolve()
        if not path.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
            continue
        if not path.exists():
            problems.append(f"{target}: {path.relative_to(ROOT)} does not exist")
            continue
        if anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"{target}: no heading with anchor #{anchor} in {path.relative_to(ROOT)}")
    assert not problems, "broken links in README.md:\n" + "\n".join(problems)


def test_readme_holds_the_setup_commands_verbatim() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    for command in SETUP_COMMANDS:
        assert "    " + command in lines, f"README.md must hold, on its own 4-space-indented line: {command}"
