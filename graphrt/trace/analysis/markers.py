"""Which ranges are steps: graphrt's own step ranges, torch.profiler's iterations, and each serving
engine's step markers, read by that engine's module (graphrt.engines: its forms, by the releases
that write them, each read from that release's source). A marker states only what it says, never
a guess (`UNKNOWN` where it does not say).

- graphrt: `decode_step[eager]`, `decode_step[piecewise,bs=8]`, `replay[bs=8]` (a replay states
  the graph's size, which a batch is padded up to, not the live rows).
- vLLM, SGLang, ATOM, TensorRT-LLM: graphrt.engines.vllm, .sglang, .atom, .tensorrt_llm.
- torch.profiler: `ProfilerStep#N`, one iteration of the whole process, saying nothing of phase
  or batch.

Markers nest (vLLM's annotation inside `ProfilerStep#N`, its runner's function inside the
annotation, an engine's step inside another's): `graphrt.trace.analysis.membership` keeps one
step for each, by `tier` (lower wins) and, between two of one tier, the inner one.

A range named like a marker that states what no engine writes marks no step, and is `Unread`:
one that does not parse (`step[DECODE bs=abc]`), or one whose figures cannot be a step's (more
real rows than its graph holds, a prefill or decode of 0 requests, a graph of 0 rows, a count
from COUNT_BOUND up). Such a marker is left out rather than refused: one bad name in a serving
trace of thousands of steps leaves the others worth reading, and the analysis names it in one
note line (graphrt.trace.analysis.steps) so that its absence is never silent.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from graphrt.engines.registry import ENGINES
from graphrt.engines.step_marker import ANNOTATION, PROFILER_ITERATION, Marker, PastBound, count
from graphrt.errors import cut
from graphrt.vocab import IDLE, UNKNOWN, Mode, Phase

PHASES = tuple(Phase)

GRAPHRT, PROFILER = "graphrt", "torch.profiler"

# the markers, as a note names them where a trace has none
MARKERS = "graphrt's, " + ", ".join(f"{engine.name}'s" for engine in ENGINES) + " or ProfilerStep#N"
_ROWS_RUN = (Phase.PREFILL, Phase.DECODE, Phase.MIXED, Phase.VERIFY, Phase.DRAFT)  # phases that ran a request

_GRAPHRT = re.compile(r"(decode_step|replay)\[([^\]]*)\]")
_PROFILER_STEP = re.compile(r"ProfilerStep#\d+", re.ASCII)
_DIGITS = re.compile(r"[0-9]+")
# what a name that begins like a marker was expected to be, by that beginning
_LOOKS_LIKE = (
    (re.compile(r"(decode_step|replay)\["), "graphrt's decode_step[MODE,bs=N] or replay[bs=N]"),
    *((engine.begins, engine.forms) for engine in ENGINES),
    (re.compile(r"ProfilerStep#"), "ProfilerStep#N"),
)


def _graphrt(kind: str, inside: str) -> Marker:
    fields = dict(part.split("=", 1) for part in inside.split(",") if "=" in part)
    if "bs" in fields and not _DIGITS.fullmatch(fields["bs"]):
        raise PastBound("bs", fields["bs"], "not a count")
    size = count("bs", fields["bs"]) if "bs" in fields else None
    if kind == "replay":
        return Marker(GRAPHRT, "graphrt replay[...]", ANNOTATION, Phase.DECODE, padded_to=size, mode=Mode.GRAPH)
    mode = inside.split(",")[0]
    return Marker(GRAPHRT, "graphrt decode_step[...]", ANNOTATION, Phase.DECODE, padded_to=size,
                  mode=Mode(mode) if mode in (Mode.EAGER, Mode.PIECEWISE) else None)


def _parse(name: str) -> Marker | None:
    """The marker `name` is, or None for a range that marks no step; PastBound where a count
    it states is past any batch."""
    if m := _GRAPHRT.fullmatch(name):
        return _graphrt(m.group(1), m.group(2))
    for engine in ENGINES:
        if (marker := engine.read_marker(name)) is not None:
            return marker
    if _PROFILER_STEP.fullmatch(name):
        return Marker(PROFILER, "torch.profiler ProfilerStep#N", PROFILER_ITERATION)
    return None


@dataclass(frozen=True)
class Unread:
    """A range named like a step marker that marks no step: its name, the marker it was
    expected to be, and why it is not one (`why` follows the name: "does not read as one")."""

    name: str
    expected: str
    why: str


def _impossible(m: Marker) -> str | None:
    """What the marker states that no step can be, or None."""
    if m.padded_to == 0:
        return "states a graph of 0 rows (expected 1 or more)"
    if m.requests is not None and m.padded_to is not None and m.requests > m.padded_to:
        return f"states {m.requests} real rows in a graph of {m.padded_to} (expected at most the graph's size)"
    if m.requests == 0 and m.phase in _ROWS_RUN:
        return f"states a {m.phase} step of 0 requests (expected 1 or more)"
    return None


def _expected(name: str) -> str | None:
    """The marker a name that begins like one was expected to be, or None."""
    return next((form for begins, form in _LOOKS_LIKE if begins.match(name)), None)


def _marker(name: str) -> Marker | Unread | None:
    """The marker `name` is; Unread where its counts cannot be a step's; None where it is no
    marker (or does not parse: `unread` tells those apart, where a note needs it)."""
    try:
        marker = _parse(name)
    except PastBound as e:
        return Unread(name, _expected(name) or "a step marker", f"states {e.field}={cut(e.digits, 16)}, {e.reason}")
    why = None if marker is None else _impossible(marker)
    return marker if why is None else Unread(name, _expected(name) or marker.form, why)


def parse(name: str) -> Marker | None:
    """The marker `name` is, or None for a range that marks no step (`unread` says why, where it
    is named like a marker)."""
    found = _marker(name)
    return found if isinstance(found, Marker) else None


def unread(names: Iterable[str]) -> list[Unread]:
    """Of the distinct names, in order, those named like a step marker that mark no step."""
    out = []
    for name in dict.fromkeys(names):
        found = _marker(name)
        if found is None and (expected := _expected(name)) is not None:
            found = Unread(name, expected, "does not read as one")
        if isinstance(found, Unread):
            out.append(found)
    return out


def step_mode(launches: int, graph_launches: int, launches_recorded: bool, marker: Marker) -> str:
    """How a step ran, where the trace records launch calls: `idle` (it launched nothing: no
    kernel, no graph, so it says nothing of graphs and is not an eager step), `eager` (kernels,
    no graph launch), `graph` (one), `piecewise` (several); else as its marker says (graphrt's
    own), else unknown. `launches`: its launch calls of any kind, `graph_launches` among them."""
    if launches_recorded:
        if not launches:
            return IDLE
        return Mode.EAGER if not graph_launches else Mode.GRAPH if graph_launches == 1 else Mode.PIECEWISE
    return marker.mode or UNKNOWN


def group_label(marker: Marker, mode: str) -> str:
    """The group an engine's step counts in, by phase, batch and mode: `decode bs=32 (graph)`."""
    phase = "step" if marker.phase == Phase.UNKNOWN else marker.phase
    batch = "" if marker.requests is None else f" bs={marker.requests}"
    return f"{phase}{batch} ({mode})"


@dataclass(frozen=True)
class Step:
    """A range chosen as a step (by index into `Trace.ranges`), what its marker says, how it
    ran, and the group it counts in: graphrt's own steps and `ProfilerStep#N` group by name
    (graphrt.trace.analysis.names.group_name), an engine's by `group_label`."""

    range: int
    marker: Marker
    mode: str
    group: str


def choose_steps(names: Sequence[str], parent: Sequence[int | None], threads: Sequence[tuple[int, int]],
                 starts: Sequence[int], ends: Sequence[int]) -> list[tuple[int, Marker]]:
    """The steps among ranges named `names`, by start, each counted once where markers nest.
    `parent[r]` is the innermost range around r on its thread, `threads[r]` its (pid, tid).

    A marker loses to one around it of a lower tier, and to one inside it of a lower or the same
    tier (the inner one is the engine's model step, the outer a wrapper round it). A
    `ProfilerStep#N` spans its whole process, so it also loses to any other step that began
    inside it on another thread of the process."""
    marks = {r: m for r, name in enumerate(names) if (m := parse(name)) is not None}
    beaten: set[int] = set()
    for r, m in marks.items():
        p = parent[r]
        while p is not None:
            outer = marks.get(p)
            if outer is not None and outer.tier < m.tier:
                beaten.add(r)
            if outer is not None and m.tier <= outer.tier:
                beaten.add(p)
            p = parent[p]
    chosen = sorted((r for r in marks if r not in beaten), key=lambda r: starts[r])
    begun: dict[int, list[tuple[int, int]]] = {}  # per process: (start, tid) of its other steps, by start
    for r in chosen:
        if marks[r].tier < PROFILER_ITERATION:
            begun.setdefault(threads[r][0], []).append((starts[r], threads[r][1]))

    def beaten_elsewhere(r: int) -> bool:
        others = begun.get(threads[r][0], [])
        first = bisect.bisect_left(others, (starts[r], -1))
        return any(tid != threads[r][1] for start, tid in
                   itertools.takewhile(lambda o: o[0] < ends[r], itertools.islice(others, first, None)))

    return [(r, marks[r]) for r in chosen if marks[r].tier < PROFILER_ITERATION or not beaten_elsewhere(r)]
