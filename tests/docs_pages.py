"""What the README and the pages of docs/ show: their commands, the output shown under a command,
the JSON fields they name, and their links. `tests/test_docs.py` checks each against graphrt."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# traces/README.md where it is: make mutate's copy of the tree has no traces/
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *(ROOT / "traces").glob("README.md")]

FENCE = re.compile(r"^```(\S*)\s*$")
COMMENT = re.compile(r"\s+#\s")  # a command's comment: " # " after it (no command shown has a # of its own)
DASHES = re.compile(r"-+( +-+)+")  # the rule under a table's header
LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass
class Example:
    """One command as a page shows it, with the lines it shows printed under it (`$ command`)."""

    page: Path
    line: int
    command: str
    comment: str = ""
    shown: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def gpu_only(self) -> bool:
        return "GPU only" in self.comment


def examples(page: Path) -> list[Example]:
    """Every line of a `sh` block that is not a comment, and every `$ command` of a block with no
    language, the lines after it up to the next `$` being what it printed."""
    found: list[Example] = []
    language: str | None = None  # None outside a fenced block
    printing: Example | None = None  # the `$ command` whose output the lines now read are
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if fence := FENCE.match(line):
            language, printing = (fence.group(1) if language is None else None), None
        elif language == "sh" and line.strip() and not line.lstrip().startswith("#"):
            command, *comment = COMMENT.split(line.strip(), maxsplit=1)
            found.append(Example(page, number, command, "".join(comment)))
        elif language == "" and line.startswith("$ "):
            command, *comment = COMMENT.split(line[2:].strip(), maxsplit=1)
            printing = Example(page, number, command, "".join(comment))
            found.append(printing)
        elif printing is not None:
            printing.shown.append(line)
    return found


def table_headers(shown: list[str]) -> list[list[str]]:
    """The columns of each table shown: a line over a rule of dashes, split where two spaces part
    it (a `...` standing for columns left out is not one)."""
    return [[c for c in re.split(r"\s{2,}", line.strip()) if c != "..."]
            for line, rule in zip(shown, shown[1:]) if DASHES.fullmatch(rule.strip())]


def labelled_lines(shown: list[str]) -> list[tuple[str, bool]]:
    """What each labelled line shown (`speedup graph vs eager: 1.02x`) says before its first figure,
    whitespace folded, and whether it may stand anywhere in a printed line (shown after `... `);
    the machine's own line (`model · CPU · dtype …`) is left out."""
    labels = []
    for line in shown:
        text = line.strip()
        inside = text.startswith("... ")
        text = text.removeprefix("... ")
        if ":" not in text or " · " in text:
            continue
        label = " ".join(re.split(r"\d", text, maxsplit=1)[0].split())
        if label:
            labels.append((label, inside))
    return labels


def json_fields(page: Path) -> list[str]:
    """The fields named in the page's sentence that begins "`--json` holds", up to its end."""
    text = " ".join(page.read_text().split())
    start = text.find("`--json` holds")
    if start < 0:
        return []
    sentence = re.split(r"\.\s|; `--plot`", text[start:], maxsplit=1)[0]
    return [name for name in re.findall(r"`([a-z][a-z0-9_]*)`", sentence)]


def headings(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as -."""
    anchors = set()
    language: str | None = None
    for line in page.read_text().splitlines():
        if fence := FENCE.match(line):
            language = fence.group(1) if language is None else None
        elif language is None and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every markdown link to a file or heading (web addresses left out)."""
    return [(number, target) for number, line in enumerate(page.read_text().splitlines(), 1)
            for target in LINK.findall(line) if not target.startswith(("http://", "https://", "mailto:"))]
