"""Where a replay first goes wrong: the first probe (graphrt.graphs.probe) whose replayed value
differs from eager's, while every probe before it matched.

An eager run and a probed graph start from the same state and get the same inputs; after each
replay its probes are compared with the eager step's, in call order:

- the step's inputs differ: the cause is outside the step (what fills its static inputs);
- a module's output differs and everything before it matched: that module is where the replay
  first computed something else (a tensor it reads was rebound or replaced since the capture,
  a Python value was frozen, memory was reused). On a tape, the op inside it that first
  differs is named too: a tape knows the module of every op it replays;
- only the step's output differs: the step's own code outside any module;
- nothing differs over the steps compared.

Values compare within a tolerance stated per dtype (`TOLERANCES`; exact for integers and
booleans). Modules a replay does not probe (a piecewise step's eager attention cores) are
skipped; the others are matched with eager's by name and call count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from graphrt import nvtx
from graphrt.graphs.probe import Probe, observe
from graphrt.graphs.tape import TapeGraph
from graphrt.opcount import classify, does_work, storage_key

T = TypeVar("T")
Tolerances = Mapping[torch.dtype, tuple[float, float]]  # dtype -> (atol, rtol)

# A replay of the captured kernels computes the same bits as eager; these leave room only for
# a last-bit difference, not for a bug (which is larger by orders of magnitude).
TOLERANCES: Tolerances = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1e-2),
}


def uniform_tolerance(atol: float, rtol: float) -> Tolerances:
    """One tolerance for every floating dtype."""
    return {dtype: (atol, rtol) for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}


@dataclass(frozen=True)
class ProbeDifference:
    """One probe of one step whose replayed value is not eager's."""

    probe: str  # "input NAME", a module range name (`[i]` for one of several outputs), "output"
    step: int
    row: int | None  # the row (index along dim 0) of the largest difference; None for a scalar
    max_abs_diff: float  # inf where the shapes or dtypes differ
    limit: str  # what it exceeds, in words: "0 (exact)", "atol 1e-05 + rtol 1e-05 × |eager|";
    #             where the shapes or dtypes differ, how

    @property
    def kind(self) -> str:
        if self.probe.startswith("input "):
            return "inputs"
        return "output" if self.probe.partition("[")[0] == "output" else "module"

    @property
    def module(self) -> str:
        """The module's range name, without the `[i]` of one of several outputs."""
        name, bracket, _ = self.probe.rpartition("[")
        return name if bracket and self.probe.endswith("]") else self.probe


def _tolerance(dtype: torch.dtype, tolerances: Tolerances) -> tuple[float, float] | None:
    return tolerances.get(dtype, (0.0, 0.0)) if dtype.is_floating_point else None


def compare_values(eager: torch.Tensor, replay: torch.Tensor, tolerances: Tolerances, rows: int | None = None
                   ) -> tuple[int | None, float, str] | None:
    """(row, max |Δ|, limit) where `replay` differs from `eager` beyond its dtype's tolerance;
    None where it does not. `rows`: compare only the first rows of a replayed value whose first
    dimension is longer than eager's `rows` (a graph padded to its bucket)."""
    if rows is not None and replay.dim() and eager.dim() and replay.shape[0] > eager.shape[0] == rows:
        replay = replay[:rows]
    if eager.shape != replay.shape or eager.dtype != replay.dtype:
        return None, math.inf, f"shape or dtype: {replay.dtype} {list(replay.shape)}, eager's {eager.dtype} {list(eager.shape)}"
    if eager.numel() == 0:
        return None
    tolerance = _tolerance(eager.dtype, tolerances)
    a, b = eager.double(), replay.double()
    diff = (a - b).abs()
    if tolerance is None:
        excess, limit = diff, "0 (exact)"
    else:
        atol, rtol = tolerance
        excess, limit = diff - (atol + rtol * a.abs()), f"atol {atol:g} + rtol {rtol:g} × |eager|"
    excess = torch.where(torch.isnan(a) & torch.isnan(b), 0.0, excess.nan_to_num(nan=math.inf))
    if not (excess > 0).any():
        return None
    worst = int(excess.reshape(-1).argmax())
    row = int(torch.unravel_index(torch.tensor(worst), eager.shape)[0]) if eager.dim() else None
    return row, float(diff.nan_to_num(nan=math.inf).max()), limit


def first_difference(eager: Sequence[Probe], replay: Sequence[Probe], step: int,
                     tolerances: Tolerances = TOLERANCES, rows: int | None = None
                     ) -> ProbeDifference | None:
    """The first probe of `replay`, in its order, whose value differs from eager's probe of the
    same name and call count. `rows`: compare only the first rows of a probe whose first
    dimension is longer (a graph padded to its bucket)."""
    seen: dict[str, int] = {}
    keyed: dict[tuple[str, int], torch.Tensor] = {}
    for name, value in eager:
        keyed[(name, seen.get(name, 0))] = value
        seen[name] = seen.get(name, 0) + 1
    seen.clear()
    for name, value in replay:
        key = (name, seen.get(name, 0))
        seen[name] = key[1] + 1
        reference = keyed.get(key)
        if reference is None:  # eager has no such call: nothing to compare it with
            continue
        found = compare_values(reference, value, tolerances, rows)
        if found is not None:
            return ProbeDifference(name, step, *found)
    return None


# ---------------------------------------------------------------------------------------------
# Ops inside a module, on a tape


@dataclass(frozen=True)
class OpValue:
    """One op that does work, as a tape records it: its ranges, its name, its tensors' values
    at the end of the step."""

    ranges: tuple[str, ...]
    name: str
    values: tuple[torch.Tensor, ...]


class _OpRecorder(TorchDispatchMode):
    """Runs every op unchanged and keeps each op that does work (a tape's entries) with the
    ranges open at the time; `values()` copies their results once the step is done, as a tape's
    tensors hold them after a replay."""

    def __init__(self, open_ranges: list[str]) -> None:
        super().__init__()
        self.open_ranges = open_ranges
        self.ops: list[tuple[tuple[str, ...], str, Any]] = []
        self.paused = False  # set while a probe copies: not an op of the step

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.paused and does_work(classify(func, args, kwargs, out)):
            self.ops.append((tuple(self.open_ranges), str(func), out))
        return out

    def values(self) -> list[OpValue]:
        return [OpValue(ranges, name, tuple(t.detach().clone() for t in _leaves(out)))
                for ranges, name, out in self.ops]


def _leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _leaves(item)]
    return []


def record_step(fn: Callable[[], T], model: nn.Module | None, inputs: Mapping[str, torch.Tensor],
                *, output: bool = True, ops: bool = False) -> tuple[T, list[Probe], list[OpValue]]:
    """Run `fn()` eagerly: its result, a copy of each probe, and (with `ops`) each op that does
    work with its value at the end of the step. Module ranges must be attached to `model` for
    ops to know their modules (graphrt.graphs.lint.module_ranges)."""
    probes: list[Probe] = []
    if not ops:
        out = observe(fn, model, inputs, lambda name, t: probes.append((name, t.detach().clone())), output)
        return out, probes, []
    with nvtx.open_ranges() as stack:
        recorder = _OpRecorder(stack)

        def keep(name: str, t: torch.Tensor) -> None:
            recorder.paused = True
            probes.append((name, t.detach().clone()))
            recorder.paused = False

        with recorder:
            out = observe(fn, model, inputs, keep, output)
    return out, probes, recorder.values()


def tape_ops(tapes: Sequence[TapeGraph], skip: set[int]) -> list[OpValue]:
    """Each op of `tapes` (one step's, in order) with its value as the last replay left it;
    ops that write into a storage of `skip` (the probe copies) left out."""
    found = []
    for tape in tapes:
        for ranges, name, out in zip(tape.op_ranges, tape.op_names, tape.op_outputs):
            leaves = _leaves(out)
            if not any(storage_key(t) in skip for t in leaves):
                found.append(OpValue(ranges, name, tuple(t.detach().clone() for t in leaves)))
    return found


def first_op_inside(module: str, eager: Sequence[OpValue], replay: Sequence[OpValue],
                    tolerances: Tolerances = TOLERANCES, rows: int | None = None) -> str | None:
    """The first op inside `module` (its range, children included) whose replayed value
    differs from eager's, in words; None where none does or the tape knows no ranges."""
    inside = [op for op in eager if module in op.ranges]
    replayed = [op for op in replay if module in op.ranges]
    if not replayed:
        return None
    for k, (a, b) in enumerate(zip(inside, replayed)):
        if a.name != b.name:
            return f"op {k + 1} inside it is {b.name} on the tape, {a.name} eagerly"
        if len(a.values) != len(b.values) or any(
                compare_values(x, y, tolerances, rows) is not None for x, y in zip(a.values, b.values)):
            where = b.ranges[-1] if b.ranges and b.ranges[-1] != module else None
            return f"{b.name} (op {k + 1} of {len(replayed)} inside it{f', in {where}' if where else ''})"
    if len(inside) != len(replayed):
        return f"it runs {len(replayed)} ops on the tape, {len(inside)} eagerly"
    return None


# ---------------------------------------------------------------------------------------------
# The verdict


@dataclass(frozen=True)
class Localization:
    """What comparing a probed replay with eager, step by step, found."""

    steps: int  # steps compared (up to and including the one that differs)
    probes: int  # probes per step
    copies: int  # copies the probes add to one step (one per probe)
    bytes: int  # bytes they copy per step
    difference: ProbeDifference | None
    first_op: str | None = None  # on a tape: the first op inside the module that differs

    @property
    def verdict(self) -> str:
        """"none", "inputs", "module" or "output"."""
        return "none" if self.difference is None else self.difference.kind

    def describe(self) -> str:
        d = self.difference
        cost = f"probes: {self.copies} copies, {_size(self.bytes)} per step"
        if d is None:
            return (f"localized: no difference: every probe (inputs, module outputs, output) matches "
                    f"eager over {self.steps} steps ({cost})")
        at = f"step {d.step}{'' if d.row is None else f', row {d.row}'}, " + (
            d.limit if math.isinf(d.max_abs_diff) else f"max |Δ| {d.max_abs_diff:.3g} > {d.limit}")
        if d.kind == "inputs":
            return (f"localized: the step's inputs already differ ({d.probe}, {at}): the cause is "
                    f"outside the step, in what fills its inputs ({cost})")
        if d.kind == "output":
            return (f"localized: the step's inputs and every module's output match, its output "
                    f"differs ({at}): the step's own code outside any module ({cost})")
        op = f"; first op inside it that differs: {self.first_op}" if self.first_op else ""
        which = f" ({d.probe})" if d.probe != d.module else ""
        return (f"localized: {d.module} is the first module whose replayed output{which} differs "
                f"from eager: {at}; everything before it matched{op} ({cost})")

    def as_dict(self) -> dict[str, Any]:
        d = self.difference
        return {"verdict": self.verdict, "module": d and d.kind == "module" and d.module or None,
                "probe": d and d.probe, "step": d and d.step, "row": d and d.row,
                "max_abs_diff": d and d.max_abs_diff, "first_op": self.first_op,
                "steps": self.steps, "probe_copies": self.copies, "probe_bytes": self.bytes,
                "text": self.describe()}


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


class StepComparer:
    """Compares one replayed step after another with the eager run's probes (and, on a tape,
    its ops); stops at the first difference, which `result()` then reports."""

    def __init__(self, eager_probes: Sequence[Sequence[Probe]], eager_ops: Sequence[Sequence[OpValue]],
                 tolerances: Tolerances = TOLERANCES, rows: int | None = None) -> None:
        self.eager_probes, self.eager_ops = eager_probes, eager_ops
        self.tolerances, self.rows = tolerances, rows
        self.compared = 0
        self.difference: ProbeDifference | None = None
        self.first_op: str | None = None
        self.probes = self.copies = self.bytes = 0

    @property
    def done(self) -> bool:
        return self.difference is not None or self.compared >= len(self.eager_probes)

    def compare(self, replayed: Sequence[Probe], copies: int, nbytes: int,
                tape_ops: Callable[[], list[OpValue]] | None = None) -> None:
        """Step `self.compared`'s probes as the replay left them; `tape_ops` reads the tape's
        ops of the same replay (on a tape; called only where a module differs)."""
        if self.done:
            return
        step = self.compared
        self.compared += 1
        self.probes, self.copies, self.bytes = len(replayed), copies, nbytes
        self.difference = first_difference(self.eager_probes[step], replayed, step, self.tolerances, self.rows)
        if self.difference is not None and self.difference.kind == "module" and tape_ops is not None \
                and step < len(self.eager_ops):
            self.first_op = first_op_inside(self.difference.module, self.eager_ops[step], tape_ops(),
                                            self.tolerances, self.rows)

    def result(self) -> Localization:
        return Localization(self.compared, self.probes, self.copies, self.bytes, self.difference, self.first_op)

