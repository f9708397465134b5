"""What a step marker says: which engine wrote it, the step's phase and its batch.

Serving engines mark each model step with a range of their own; graphrt reads the name and takes
only what it states, never a guess (`UNKNOWN` where it does not say). The forms, by engine and by
the releases that write them (each read from that release's source):

- graphrt: `decode_step[eager]`, `decode_step[piecewise,bs=8]`, `replay[bs=8]` (a replay states
  the graph's size, which a batch is padded up to, not the live rows).
- vLLM V1, `Worker.annotate_profile` (vllm/v1/worker/gpu_worker.py), a `record_function` under
  torch.profiler, an NVTX range under the CUDA profiler:
  `execute_new_2_cached_30` (0.12, 0.13: new and running requests; running ones may be
  decoding or still prefilling in chunks, so only an all-new step has a phase);
  `execute_context_2(14721)_generation_30(30)` (0.14 on: context requests and their tokens,
  generation requests and theirs); with `detailed_trace_annotation` (0.26 on)
  `execute_14751_context_2(sq14721sk…sqsq…sqsk…)_generation_30(sq30sk…sqsq…sqsk…)`.
  Recorded with stack, its model runner's `execute_model` is a python function inside it
  (`vllm/v1/worker/gpu_model_runner.py(3380): execute_model`): a step where no annotation is.
- SGLang, `build_step_span_name` (0.5.11 on; model_runner.py, then utils/profile_utils.py):
  `step[EXTEND bs=2 toks=14721]`, `step[DECODE bs=64]`, `step[MIXED bs=2]`, `step[IDLE bs=0]`,
  `step[TARGET_VERIFY bs=8]`, any ForwardMode by name; 0.5.19 on may append aggregates
  (`c=1 g=1 c_sq=… g_sq=…`, `forward_id=…`); 0.5.20 on names the target's verify step `VERIFY`
  and every draft runner's step `DRAFT`; a frozen-KV draft loop writes
  `step[DRAFT_LOOP raw_bs=3 bs=4 topk=1]` (3 real rows in a graph of 4).
- ATOM: `prefill[bs=2 tok=14721 ctx=[…]]`, `decode[bs=64 tok=64 d=64]`,
  `decode[bs=117/128 tok=117 d=117]` (117 real rows padded to a graph of 128),
  `decode[bs=128 tok=384 p=2 d=126 spec=3]` (2 of the rows still prefilling).
- TensorRT-LLM's PyTorch backend, `PyExecutor._forward_step`, an NVTX range in the
  `TensorRT-LLM` domain (Nsight Systems traces only): `_forward_step: 1 ctx reqs, 7 gen reqs`,
  `[Executor] _forward_step: …`, `[Executor] _forward_step 42: …`, and since its per-iteration
  context-token log (2026) `[Executor] _forward_step 42: 1 ctx reqs, 512 ctx tokens, 7 gen reqs`.
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

from graphrt.errors import cut
from graphrt.trace.read.chrome_events import is_runner_function

UNKNOWN = "unknown"
PHASES = ("prefill", "decode", "mixed", "idle", "verify", "draft", UNKNOWN)

GRAPHRT, VLLM, SGLANG, ATOM, TRTLLM, PROFILER = "graphrt", "vLLM", "SGLang", "ATOM", "TensorRT-LLM", "torch.profiler"
ANNOTATION, RUNNER_FUNCTION, PROFILER_ITERATION = 1, 2, 3  # tiers: the lower wins where markers nest

# the markers, as a note names them where a trace has none
MARKERS = "graphrt's, vLLM's, SGLang's, ATOM's, TensorRT-LLM's or ProfilerStep#N"
# engines hold a step's rows and tokens in int32 tensors (positions, slot maps, grid sizes): no
# marker of theirs states a count from 2**31 up
COUNT_BOUND = 2**31
_ROWS_RUN = ("prefill", "decode", "mixed", "verify", "draft")  # phases that ran at least one request


@dataclass(frozen=True)
class Marker:
    """What one marker states. `requests`: the step's batch, as requests (rows) it ran; `tokens`:
    the tokens it ran, where the marker gives them; `padded_to`: the graph size the batch was
    padded up to, where the marker says; `mode`: eager/graph/piecewise where the marker itself
    says how the step ran (graphrt's own), else None."""

    engine: str
    form: str  # the marker's form, as the output names it: "SGLang step[...]"
    tier: int
    phase: str = UNKNOWN
    requests: int | None = None
    tokens: int | None = None
    padded_to: int | None = None
    mode: str | None = None


def _phase(prefilling: int, decoding: int) -> str:
    """The phase of a step that ran `prefilling` requests in prefill and `decoding` in decode."""
    if prefilling and decoding:
        return "mixed"
    return "prefill" if prefilling else "decode" if decoding else "idle"


# digits are ASCII only (re.ASCII): `\d` would take other scripts' digits too, which no engine writes
_GRAPHRT = re.compile(r"(decode_step|replay)\[([^\]]*)\]")
_VLLM_NEW_CACHED = re.compile(r"execute_new_(\d+)_cached_(\d+)", re.ASCII)
_VLLM = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)", re.ASCII)
_VLLM_DETAILED = re.compile(r"execute_(\d+)_context_(\d+)\(sq(\d+)sk\d+sqsq\d+sqsk\d+\)"
                            r"_generation_(\d+)\(sq(\d+)sk\d+sqsq\d+sqsk\d+\)", re.ASCII)
_SGLANG = re.compile(r"step\[([A-Z][A-Z_0-9]*)((?: [a-z_]+=\d+)*)\]", re.ASCII)
_ATOM = re.compile(r"(prefill|decode)\[bs=(\d+)(?:/(\d+))?( .*)?\]", re.ASCII)  # ctx=[…] holds brackets of its own
_TRTLLM = re.compile(r"(?:\[Executor\] )?_forward_step(?: \d+)?: (\d+) ctx reqs, (?:(\d+) ctx tokens, )?(\d+) gen reqs",
                     re.ASCII)
_PROFILER_STEP = re.compile(r"ProfilerStep#\d+", re.ASCII)
_FIELDS = re.compile(r"([a-z_]+)=(\d+)", re.ASCII)
_DIGITS = re.compile(r"[0-9]+")
# what a name that begins like an engine's marker was expected to be, by that beginning
_LOOKS_LIKE = (
    (re.compile(r"(decode_step|replay)\["), "graphrt's decode_step[MODE,bs=N] or replay[bs=N]"),
    (re.compile(r"execute_(new_|context_|[0-9]+_context_)"),
     "vLLM's execute_context_N(T)_generation_N(T), execute_T_context_… or execute_new_N_cached_N"),
    (re.compile(r"step\["), "SGLang's step[MODE bs=N key=N …]"),
    (re.compile(r"(prefill|decode)\["), "ATOM's prefill[bs=N …] or decode[bs=N …], decode[bs=N/G …]"),
    (re.compile(r"(\[Executor\] )?_forward_step( [0-9]+)?:"), "TensorRT-LLM's _forward_step: N ctx reqs, N gen reqs"),
    (re.compile(r"ProfilerStep#"), "ProfilerStep#N"),
)

# SGLang's ForwardMode (and its stage names) by the phase they are
_SGLANG_PHASES = {"EXTEND": "prefill", "SPLIT_PREFILL": "prefill", "DECODE": "decode", "MIXED": "mixed",
                  "IDLE": "idle", "TARGET_VERIFY": "verify", "VERIFY": "verify", "DRAFT": "draft",
                  "DRAFT_EXTEND": "draft", "DRAFT_EXTEND_V2": "draft", "DRAFT_LOOP": "draft"}


class _PastBound(ValueError):
    """A count from COUNT_BOUND up, which no engine writes."""


def _count(field: str, digits: str) -> int:
    """A count a marker states, as ASCII digits; _PastBound from COUNT_BOUND up (told by the
    digits first: Python makes no int of more than 4,300 of them)."""
    if len(digits) > 10 or (n := int(digits)) >= COUNT_BOUND:
        raise _PastBound(f"states {field}={cut(digits, 16)}, past any batch (engines count below 2**31)")
    return n


def _graphrt(kind: str, inside: str) -> Marker:
    fields = dict(part.split("=", 1) for part in inside.split(",") if "=" in part)
    if "bs" in fields and not _DIGITS.fullmatch(fields["bs"]):
        raise _PastBound(f"states bs={cut(fields['bs'], 16)}, not a count")
    size = _count("bs", fields["bs"]) if "bs" in fields else None
    if kind == "replay":
        return Marker(GRAPHRT, "graphrt replay[...]", ANNOTATION, "decode", padded_to=size, mode="graph")
    mode = inside.split(",")[0]
    return Marker(GRAPHRT, "graphrt decode_step[...]", ANNOTATION, "decode", padded_to=size,
                  mode=mode if mode in ("eager", "piecewise") else None)


def _sglang(stage: str, rest: str) -> Marker:
    given = dict(_FIELDS.findall(rest))  # others (c_sqsq=…) may pass any bound: only these are counts
    f = {k: _count(k, v) for k, v in given.items() if k in ("bs", "raw_bs", "toks", "c", "g", "c_sq", "g_sq")}
    form = "SGLang step[...]"
    if stage == "DRAFT_LOOP":  # raw_bs real rows in a graph of bs
        return Marker(SGLANG, form, ANNOTATION, "draft", f.get("raw_bs"), padded_to=f.get("bs"))
    phase = _SGLANG_PHASES.get(stage, UNKNOWN)
    if stage == "MIXED" and "c" in f and "g" in f:
        phase = _phase(f["c"], f["g"])
    sums = [f[k] for k in ("c_sq", "g_sq") if k in f]
    tokens = f.get("toks") if "toks" in f else sum(sums) if sums else None
    return Marker(SGLANG, form, ANNOTATION, phase, f.get("bs"), tokens)


def _atom(phase: str, bs: str, padded: str | None, rest: str | None) -> Marker:
    given = dict(_FIELDS.findall(rest or ""))
    f = {k: _count(k, v) for k, v in given.items() if k in ("tok", "p")}
    if phase == "decode" and f.get("p"):
        phase = "mixed"
    return Marker(ATOM, "ATOM prefill[...]/decode[...]", ANNOTATION, phase, _count("bs", bs), f.get("tok"),
                  _count("bs", padded) if padded else None)


def _parse(name: str) -> Marker | None:
    """The marker `name` is, or None for a range that marks no step; _PastBound where a count
    it states is past any batch."""
    if m := _GRAPHRT.fullmatch(name):
        return _graphrt(m.group(1), m.group(2))
    if m := _VLLM.fullmatch(name):
        c, ct, g, gt = map(_count, ("context", "context tokens", "generation", "generation tokens"), m.groups())
        return Marker(VLLM, "vLLM execute_context_…_generation_…", ANNOTATION, _phase(c, g), c + g, ct + gt)
    if m := _VLLM_DETAILED.fullmatch(name):
        total, c, _, g, _ = map(_count, ("tokens", "context", "sq", "generation", "sq"), m.groups())
        return Marker(VLLM, "vLLM execute_N_context_…_generation_…", ANNOTATION, _phase(c, g), c + g, total)
    if m := _VLLM_NEW_CACHED.fullmatch(name):
        new, cached = map(_count, ("new", "cached"), m.groups())
        phase = "prefill" if new and not cached else "idle" if not new and not cached else UNKNOWN
        return Marker(VLLM, "vLLM execute_new_…_cached_…", ANNOTATION, phase, new + cached)
    if m := _SGLANG.fullmatch(name):
        return _sglang(m.group(1), m.group(2))
    if m := _ATOM.fullmatch(name):
        return _atom(*m.groups())
    if m := _TRTLLM.fullmatch(name):
        c, _, g = m.groups()
        c, g = _count("ctx reqs", c), _count("gen reqs", g)
        return Marker(TRTLLM, "TensorRT-LLM _forward_step", ANNOTATION, _phase(c, g), c + g)
    if _PROFILER_STEP.fullmatch(name):
        return Marker(PROFILER, "torch.profiler ProfilerStep#N", PROFILER_ITERATION)
    if is_runner_function(name):
        return Marker(VLLM, "vLLM model runner execute_model (python function)", RUNNER_FUNCTION)
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
    except _PastBound as e:
        return Unread(name, _expected(name) or "a step marker", str(e))
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
            return "idle"
        return "eager" if not graph_launches else "graph" if graph_launches == 1 else "piecewise"
    return marker.mode or UNKNOWN


def group_label(marker: Marker, mode: str) -> str:
    """The group an engine's step counts in, by phase, batch and mode: `decode bs=32 (graph)`."""
    phase = "step" if marker.phase == UNKNOWN else marker.phase
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
