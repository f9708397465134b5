"""What the captures of a `graphrt trace` recorded of their ranges (per replay step, the ops or
graph nodes and the module ranges open at each), read back from the summary.json beside a trace:
a replay fires no range, so this is how its work finds its modules
(graphrt.trace.analysis.modules.CaptureRecords holds them)."""

from __future__ import annotations

import json
from pathlib import Path

from graphrt.errors import GraphrtError

OpRanges = dict[str, list[tuple[str, tuple[str, ...]]]]  # replay step -> per tape entry: (op, range names)
NodeRanges = dict[str, dict[int, tuple[str, ...]]]  # replay step -> graph node id -> range names


def _range_names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ValueError(f"{value!r} is not a list of range names")
    return tuple(value)


def _op_entries(entries: list) -> list[tuple[str, tuple[str, ...]]]:
    read = []
    for name, stack in entries:
        if not isinstance(name, str):
            raise ValueError(f"{name!r} is not an op name")
        read.append((name, _range_names(stack)))
    return read


def _node_stacks(nodes: dict) -> dict[int, tuple[str, ...]]:
    return {int(node): _range_names(stack) for node, stack in nodes.items()}


# what each record holds per replay step, as graphrt.trace.record.record_modes.RecordedMode writes it
_RECORDS = {"captured_ops": (_op_entries, "a list of [op name, [range names]]"),
            "node_ranges": (_node_stacks, "{graph node id: [range names]}")}


def capture_ranges(trace_file: Path) -> tuple[OpRanges, NodeRanges]:
    """What the captures of the graphs recorded of their ranges, where the trace came from
    `graphrt trace`: summary.json beside it holds it (graphrt.trace.record.record_modes.RecordedMode).
    Nothing where there is no summary.json."""
    summary = trace_file.parent / "summary.json"
    if not summary.is_file():
        return {}, {}
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError) as e:
        raise GraphrtError(f"{summary}: not a summary graphrt trace wrote ({e})") from None
    modes = data.get("modes", {}) if isinstance(data, dict) else None
    if not isinstance(modes, dict):
        raise GraphrtError(f"{summary}: not a summary graphrt trace wrote (expected a JSON object "
                           "whose 'modes' is an object)")
    read: dict[str, dict] = {key: {} for key in _RECORDS}
    for mode, facts in modes.items():
        for key, (parse, expected) in _RECORDS.items():
            try:
                read[key].update({step: parse(value) for step, value in facts.get(key, {}).items()})
            except (ValueError, AttributeError, TypeError) as e:
                raise GraphrtError(f"{summary}: modes.{mode}.{key} is not what graphrt trace writes "
                                   f"(per replay step, {expected}): {e}") from None
    return read["captured_ops"], read["node_ranges"]
