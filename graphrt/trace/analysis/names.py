"""The name a range is grouped under, and which of graphrt's steps replay a graph.

(Which ranges are steps: graphrt.trace.analysis.markers.) Names that carry a per-call counter
group without it: every `ProfilerStep#N` is one group, `ProfilerStep#*`, and
`aten::mm, op_id = 314286` or `nccl:all_reduce, seq = 12` group as `aten::mm` and `nccl:all_reduce`.
"""

from __future__ import annotations

import re

PROFILER_STEP = "ProfilerStep#"
PROFILER_STEP_GROUP = "ProfilerStep#*"

# `, op_id = 314286`, `, seq = 12` (and the same without a comma in front)
_COUNTER = re.compile(r",?\s*\b(?:op_id|seq)\s*=\s*\d+")


def is_replay(name: str) -> bool:
    """A step that replays a captured graph."""
    return name.startswith("replay[")


def group_name(name: str) -> str:
    """The name a range is grouped under: its own, less any per-call counter."""
    if name.startswith(PROFILER_STEP) and name[len(PROFILER_STEP):].isdigit():
        return PROFILER_STEP_GROUP
    return _COUNTER.sub("", name).strip() or name
