"""Where a replay first goes wrong: in the first step that differs (as the comparison that
asked judges it), the first probe (graphrt.graphs.probe) whose replayed value differs from
eager's, while every probe before it matched.

An eager run and a probed graph start from the same state and get the same inputs; after each
replay its probes are compared with the eager step's, in call order:

- the step's inputs differ: the cause is outside the step (what fills its static inputs);
- a module's output differs while its inputs and everything before matched: that module's own
  code is where the replay first computed something else (a tensor it reads was rebound or
  replaced since the capture, a Python value was frozen, memory was reused); likewise a
  module's input that differs names the caller that passed it. On a tape, the op inside that
  module that first differs is named too: a tape knows the module of every op it replays;
- a value differs that the step's own code made outside any module;
- the step differs but no probe does beyond its tolerance (rounding that adds up, or a value
  no probe holds);
- nothing differs over the steps compared; or, where a comparison that failed asked, its
  difference was not reproduced.

Values compare by graphrt.graphs.tolerance's rule: exactly on a tape, within a tolerance per
dtype relative to the value's size for a CUDA graph or a padded batch (`tolerances_for`;
integers and booleans exactly). Probes are matched with eager's by module, input or output,
and call count; those eager has no match for (a piecewise step's pieces call some modules
outside their parent's forward, and its attention cores run eagerly, unprobed) are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from graphrt.graphs.probe import STEP, Probe, observe, tensor_leaves
from graphrt.graphs.tape import TapeGraph
from graphrt.graphs.tolerance import Tolerances, ValueDifference, compare_values
from graphrt.measure import nvtx
from graphrt.measure.opcount import classify, does_work, storage_key
from graphrt.units import format_bytes

T = TypeVar("T")

# What one eager step's op values may take (a copy of everything each op wrote); above it, a
# tape's verdict names the module without the op inside it.
OP_VALUES_BYTES = 256 << 20


@dataclass(frozen=True)
class ProbeDifference:
    """One probe of one step whose replayed value is not eager's."""

    probe: Probe  # the replay's (its value: what the replay left)
    step: int
    value: ValueDifference  # where in it, how far, beyond what

    @property
    def row(self) -> int | None:
        """The index along dim 0 of the element that differs most; None for a scalar."""
        return self.value.index[0] if self.value.index else None

    @property
    def max_abs_diff(self) -> float:
        return self.value.max_abs_diff

    @property
    def kind(self) -> str:
        """"inputs": the step's inputs; "module": a module's own code (its output, or an input
        it passed to a submodule); "step": the step's own code outside any module."""
        if self.probe.where == STEP:
            return "inputs" if self.probe.what.startswith("input") else "step"
        return "step" if self.module is None else "module"

    @property
    def module(self) -> str | None:
        """The module whose own code made the value: the one that returned it, or the caller
        that passed it to a submodule (None: the step's own code)."""
        if self.probe.where == STEP:
            return None
        return self.probe.caller if self.probe.what.startswith("input") else self.probe.where


def first_difference(eager: Sequence[Probe], replay: Sequence[Probe], step: int,
                     tolerances: Tolerances, rows: int | None = None
                     ) -> ProbeDifference | None:
    """The first probe of `replay`, in its order, whose value differs from eager's probe at the
    same place (module, input or output, call count). `rows`: compare only the first rows of a
    probe whose first dimension is longer (a graph padded to its bucket)."""
    def keyed(probes: Sequence[Probe]) -> Iterator[tuple[tuple[str, str, int], Probe]]:
        seen: dict[tuple[str, str], int] = {}
        for probe in probes:
            place = (probe.where, probe.what)
            seen[place] = seen.get(place, -1) + 1
            yield (*place, seen[place]), probe

    reference = dict(keyed(eager))
    for key, probe in keyed(replay):
        if key not in reference:  # eager has no such call (a piecewise step's pieces call
            continue              # some modules outside their parent's forward)
        found = compare_values(reference[key].value, probe.value, tolerances, rows)
        if found is not None:
            return ProbeDifference(probe, step, found)
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

    def values(self) -> list[OpValue] | None:
        """A copy of what each op wrote; None where that would take more than OP_VALUES_BYTES
        (an in-place write into a long KV cache is a copy of the whole cache)."""
        written = [tensor_leaves(out) for _, _, out in self.ops]
        if sum(t.numel() * t.element_size() for leaves in written for t in leaves) > OP_VALUES_BYTES:
            return None
        return [OpValue(ranges, name, tuple(t.detach().clone() for t in leaves))
                for (ranges, name, _), leaves in zip(self.ops, written)]


def record_step(fn: Callable[[], T], model: nn.Module | None, inputs: Mapping[str, torch.Tensor],
                *, output: bool = True, ops: bool = False) -> tuple[T, list[Probe], list[OpValue] | None]:
    """Run `fn()` eagerly: its result, a copy of each probe, and (with `ops`) each op that does
    work with its value at the end of the step (None without `ops`, or where they would take
    too much memory). Module ranges must be attached to `model` for ops to know their modules
    (graphrt.graphs.lint.module_ranges)."""
    probes: list[Probe] = []
    recorder: _OpRecorder | None = None

    def keep(probe: Probe) -> None:
        if recorder is not None:
            recorder.paused = True  # the copy is the probe's, not an op of the step
        probes.append(probe._replace(value=probe.value.detach().clone()))
        if recorder is not None:
            recorder.paused = False

    if not ops:
        return observe(fn, model, inputs, keep, output), probes, None
    with nvtx.open_ranges() as stack:
        recorder = _OpRecorder(stack)
        with recorder:
            out = observe(fn, model, inputs, keep, output)
    return out, probes, recorder.values()


def tape_ops(tapes: Sequence[TapeGraph], skip: set[int]) -> list[OpValue]:
    """Each op of `tapes` (one step's, in order) with its value as the last replay left it;
    ops that write into a storage of `skip` (the probe copies) left out."""
    found = []
    for tape in tapes:
        for ranges, name, out in zip(tape.op_ranges, tape.op_names, tape.op_outputs):
            leaves = tensor_leaves(out)
            if not any(storage_key(t) in skip for t in leaves):
                found.append(OpValue(ranges, name, tuple(t.detach().clone() for t in leaves)))
    return found


def first_op_inside(module: str, eager: Sequence[OpValue], replay: Sequence[OpValue],
                    tolerances: Tolerances, rows: int | None = None) -> str | None:
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


_PROBES = "the step's inputs, each module's inputs and output, the step's output"


@dataclass(frozen=True)
class Localization:
    """What comparing a probed replay with eager, step by step, found.

    A step is blamed only where it differs as the comparison judges it (`step_difference`:
    its tokens or output beyond the comparison's tolerance); then the first probe beyond its
    dtype's tolerance names the place. `expected`, where this explains a comparison that failed,
    is what that comparison saw: a re-run that finds no step differing says it did not
    reproduce it, never that there is no difference."""

    steps: int  # steps compared (up to and including the one that differs)
    probes: int  # probes per step
    copies: int  # copies the probes add to one step (one per probe)
    bytes: int  # bytes they copy per step
    difference: ProbeDifference | None
    first_op: str | None = None  # on a tape: the first op inside the module that differs
    step_difference: str | None = None  # the step that differs, as the comparison says it
    stopped_at: int | None = None  # that step's index
    exact: bool = True  # probes compared exactly (else within a per-dtype tolerance)
    expected: str | None = None  # the failed comparison this explains

    @property
    def verdict(self) -> str:
        """"none"; "unreproduced": the comparison it explains failed, this re-run did not;
        "rounding": a step differs but no probe beyond its tolerance; else the kind of the first
        difference: "inputs", "module" or "step"."""
        if self.stopped_at is None:
            return "none" if self.expected is None else "unreproduced"
        return "rounding" if self.difference is None else self.difference.kind

    def explaining(self, comparison: str) -> Localization:
        """This localization as the explanation of `comparison`, a comparison that failed."""
        return replace(self, expected=comparison)

    def describe(self) -> str:
        d = self.difference
        cost = f"probes: {self.copies} copies, {format_bytes(self.bytes, smallest='B', largest='MiB')} per step"
        if self.verdict == "none":
            return (f"localized: no difference: every probe ({_PROBES}) matches eager over "
                    f"{self.steps} steps ({cost})")
        if self.verdict == "unreproduced":
            return (f"localized: not reproduced: the comparison differed ({self.expected}); a probed "
                    f"re-run of the same steps matched eager over {self.steps} steps. Something "
                    f"differs from run to run: the step or what runs between its steps is not "
                    f"deterministic, state outside the model is not put back between the runs, or "
                    f"the probes' copies change what memory the graph reuses ({cost})")
        if d is None:
            beyond = "at all" if self.exact else "beyond rounding (per dtype, relative to its size)"
            return (f"localized: step {self.stopped_at} differs ({self.step_difference}), but no probe "
                    f"({_PROBES}) differs {beyond}: the difference adds up from rounding (a near tie "
                    f"between tokens), or lies in a value no probe holds (a Python value the step "
                    f"returns) ({cost})")
        at = f"step {d.step}, {d.value.describe()}"
        if d.kind == "inputs":
            return (f"localized: the step's inputs already differ ({d.probe.what}, {at}): the cause "
                    f"is outside the step, in what fills its inputs ({cost})")
        if d.kind == "step":
            return (f"localized: the step's own code outside any module: {d.probe.name} differs "
                    f"({at}) while everything before it matched ({cost})")
        op = f"; first op inside it that differs: {self.first_op}" if self.first_op else ""
        if d.probe.where == d.module:
            what = f"replayed {d.probe.what}" if d.probe.what != "output" else "replayed output"
            return (f"localized: {d.module} is the first module whose {what} differs from eager "
                    f"({at}); its inputs and everything before it matched{op} ({cost})")
        return (f"localized: {d.module} is the first module whose replay differs from eager: its own "
                f"code passes {d.probe.name} that differs ({at}) while everything before it "
                f"matched{op} ({cost})")

    def as_dict(self) -> dict[str, Any]:
        d = self.difference
        index = list(d.value.index) if d is not None and d.value.index else None
        return {"verdict": self.verdict, "module": d and d.module, "probe": d and d.probe.name,
                "step": self.stopped_at, "row": index and index[0],
                "column": index[1] if index and len(index) == 2 else None, "index": index,
                "max_abs_diff": d and d.max_abs_diff, "first_op": self.first_op,
                "step_difference": self.step_difference, "comparison": self.expected,
                "steps": self.steps, "probe_copies": self.copies, "probe_bytes": self.bytes,
                "text": self.describe()}




BY_OUTPUT = "by the step's own probes"  # StepComparer.compare: judge the step by its own inputs and output


class StepComparer:
    """Compares one replayed step after another with the eager run's probes (and, on a tape,
    its ops); stops at the first step that differs, which `result()` then reports."""

    def __init__(self, eager_probes: Sequence[Sequence[Probe]], eager_ops: Sequence[Sequence[OpValue] | None],
                 tolerances: Tolerances, rows: int | None = None) -> None:
        self.eager_probes, self.eager_ops = eager_probes, eager_ops
        self.tolerances, self.rows = tolerances, rows
        self.compared = 0
        self.stopped_at: int | None = None
        self.step_difference: str | None = None
        self.difference: ProbeDifference | None = None
        self.first_op: str | None = None
        self.probes = self.copies = self.bytes = 0

    @property
    def done(self) -> bool:
        return self.stopped_at is not None or self.compared >= len(self.eager_probes)

    def compare(self, replayed: Sequence[Probe], copies: int, nbytes: int,
                read_tape_ops: Callable[[], list[OpValue]] | None = None,
                step_difference: str | None = BY_OUTPUT) -> None:
        """Step `self.compared`'s probes as the replay left them. `step_difference`: how the
        step differs as the comparison judges it (its tokens, its output beyond the
        comparison's tolerance), None where it matches: a step that matches blames nothing.
        By default the step is judged by its own probes (its inputs and output). `read_tape_ops`
        reads the tape's ops of the same replay (on a tape; called only where a module differs)."""
        if self.done:
            return
        step = self.compared
        self.compared += 1
        self.probes, self.copies, self.bytes = len(replayed), copies, nbytes
        if step_difference is BY_OUTPUT:
            own = first_difference([p for p in self.eager_probes[step] if p.where == STEP],
                                   [p for p in replayed if p.where == STEP], step, self.tolerances, self.rows)
            step_difference = None if own is None else f"{own.probe.name} differs, {own.value.describe()}"
        if step_difference is None:
            return
        self.stopped_at, self.step_difference = step, step_difference
        self.difference = first_difference(self.eager_probes[step], replayed, step, self.tolerances, self.rows)
        eager_ops = self.eager_ops[step]
        if self.difference is not None and self.difference.kind == "module" and read_tape_ops is not None \
                and eager_ops is not None:
            self.first_op = first_op_inside(self.difference.module, eager_ops, read_tape_ops(),
                                            self.tolerances, self.rows)

    def result(self) -> Localization:
        return Localization(self.compared, self.probes, self.copies, self.bytes, self.difference,
                            self.first_op, self.step_difference, self.stopped_at, not self.tolerances)
