"""The traffic a server sees: how many decode steps ran at each batch size.

`graphrt plan` reads it from one file, whichever of these it is:

- a histogram, JSON `{"batch": count}` (`{"1": 120, "8": 30}`) or CSV `batch,count` lines (a
  `batch,count` header allowed);
- a list of observed batch sizes, one a line or a JSON list (each one decode step);
- a `graphrt run --json` result or a `graphrt trace` summary.json: its steps, all at its batch.

Every entry is checked: a batch size is a positive integer, a count a non-negative integer, and
the total is positive. A bad one is refused in one line naming the file and the entry.
"""

from __future__ import annotations

import json
from pathlib import Path

from graphrt.errors import GraphrtError

Traffic = dict[int, int]  # batch size -> decode steps at that size, sizes ascending


def _integer(text: object) -> int | None:
    """`text` as an int where it is one (17, "17", 17.0), else None."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text
    if isinstance(text, float):
        return int(text) if text.is_integer() else None
    try:
        return int(str(text).strip())
    except ValueError:
        return None


def _entry(path: Path, where: str, batch: object, count: object) -> tuple[int, int]:
    b, n = _integer(batch), _integer(count)
    if b is None or b <= 0:
        raise GraphrtError(f"{path}: {where}: batch size {batch!r} is not a positive integer")
    if n is None or n < 0:
        raise GraphrtError(f"{path}: {where}: count {count!r} for batch {b} is not a "
                           "non-negative integer")
    return b, n


def _add(traffic: Traffic, path: Path, where: str, batch: object, count: object) -> None:
    b, n = _entry(path, where, batch, count)
    traffic[b] = traffic.get(b, 0) + n


def _from_json(path: Path, doc: object) -> Traffic:
    traffic: Traffic = {}
    if isinstance(doc, dict) and isinstance(doc.get("spec"), dict):  # graphrt trace summary.json
        doc = doc["spec"]
    if isinstance(doc, dict) and "batch" in doc and "steps" in doc:  # graphrt run --json
        _add(traffic, path, "its run", doc["batch"], doc["steps"])
        return traffic
    if isinstance(doc, list):  # observed batch sizes, one a step
        for i, batch in enumerate(doc):
            _add(traffic, path, f"item {i}", batch, 1)
        return traffic
    if not isinstance(doc, dict):
        raise GraphrtError(f"{path}: expected a JSON object {{\"batch\": count}}, got a "
                           f"{type(doc).__name__}")
    for key, count in doc.items():
        _add(traffic, path, f"entry {key!r}", key, count)
    return traffic


def _from_lines(path: Path, lines: list[str]) -> Traffic:
    traffic: Traffic = {}
    rows = [(number, line.strip()) for number, line in enumerate(lines, 1)
            if line.strip() and not line.lstrip().startswith("#")]
    if rows and rows[0][1].replace(" ", "").lower() == "batch,count":
        rows = rows[1:]
    for number, line in rows:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) > 2:
            raise GraphrtError(f"{path}: line {number}: {line!r}: expected `batch,count` or one "
                               "batch size")
        count = fields[1] if len(fields) == 2 else 1
        _add(traffic, path, f"line {number}", fields[0], count)
    return traffic


def read_traffic(path: str | Path) -> Traffic:
    """The traffic in `path` (any of the module's formats), sizes ascending."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise GraphrtError(f"{path}: cannot read the traffic ({getattr(e, 'strerror', None) or e})") from None
    if text.lstrip().startswith(("{", "[")):
        try:
            traffic = _from_json(path, json.loads(text))
        except json.JSONDecodeError as e:
            raise GraphrtError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    else:
        traffic = _from_lines(path, text.splitlines())
    if sum(traffic.values()) <= 0:
        raise GraphrtError(f"{path}: the traffic holds no decode step (every count is 0, or no entry)")
    return {b: traffic[b] for b in sorted(traffic)}


def describe(traffic: Traffic) -> str:
    """`1000 steps over 12 batch sizes, 1..24, mean batch 5.3`."""
    steps = sum(traffic.values())
    mean = sum(b * n for b, n in traffic.items()) / steps
    used = [b for b, n in traffic.items() if n]
    return (f"{steps} steps over {len(used)} batch sizes, {used[0]}..{used[-1]}, "
            f"mean batch {mean:.1f}")
