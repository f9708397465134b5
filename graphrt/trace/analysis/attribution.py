"""Which module each replayed kernel (or op) belongs to, carried over from a step whose ranges fired.

Under replay no Python runs and no range fires (docs/design.md, "Attribution under replay"), but a
single-stream graph replays its kernels in capture order, and an eager step of the same model
and batch issues the same kernels in the same order with every module range open around them.
So the eager step's sequence of kernel names, each with its module stack, is aligned with the
replay's by a longest common subsequence (a global alignment: an inserted copy or fill on either
side is a gap, and never shifts what comes after it), and each replayed kernel matched to an
eager one takes that kernel's stack.

Two rules keep an attribution from ever being a wrong module:

- a match counts only where two optimal alignments that break ties in opposite directions (the
  latest possible partner and the earliest) agree on the module call it lands in;
- a replayed kernel left unmatched (a copy only the replay has) takes a module only when the
  matched kernels on both sides of it lie in the same call of that module, so it was issued
  while that module's range was open. Otherwise it is reported unattributed.

The same carries a capture's own records over to a replay: a TapeGraph keeps the ranges open
at every entry (`TapeGraph.op_ranges`), which makes it the ground truth the tests hold this to.
Where a CUDA capture annotated its graph nodes (`CudaGraph.node_ranges`) and the trace gives each
replayed kernel its node, no alignment is needed: `look_up` reads each kernel's stack off its node.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

MATCHED, BETWEEN, UNATTRIBUTED = "matched", "between", "unattributed"


def align(reference: Sequence[Hashable], target: Sequence[Hashable]) -> list[int | None]:
    """A longest common subsequence of the two: for each target item, the index of the reference
    item it is matched to, or None. Of the optimal alignments, the one that matches each target
    item to the latest reference item it can.

    The LCS table is computed a row at a time as a bit vector (Hyyrö's bit-parallel form of the
    dynamic programme: bit i of a row is clear where the LCS grows at reference item i), one
    big-integer add per target item, so thousands by thousands of kernels take milliseconds.
    """
    m = len(reference)
    full = (1 << m) - 1
    where: dict[Hashable, int] = {}  # item -> bit mask of its positions in `reference`
    for i, item in enumerate(reference):
        where[item] = where.get(item, 0) | (1 << i)
    rows = [full]  # rows[j]: the table after target[:j]
    row = full
    for item in target:
        hits = row & where.get(item, 0)
        row = ((row + hits) | (row - hits)) & full
        rows.append(row)

    def lcs(i: int, j: int) -> int:  # LCS of reference[:i] and target[:j]
        return i - (rows[j] & ((1 << i) - 1)).bit_count()

    matched: list[int | None] = [None] * len(target)
    i, j = m, len(target)
    while i and j:
        if reference[i - 1] == target[j - 1]:
            matched[j - 1] = i - 1
            i, j = i - 1, j - 1
        elif lcs(i, j - 1) == lcs(i, j):
            j -= 1
        else:
            i -= 1
    return matched


def align_earliest(reference: Sequence[Hashable], target: Sequence[Hashable]) -> list[int | None]:
    """As `align`, but each target item matched to the earliest reference item it can."""
    m = len(reference)
    backwards = align(reference[::-1], target[::-1])[::-1]
    return [None if i is None else m - 1 - i for i in backwards]


@dataclass(frozen=True)
class Attribution:
    """Per target item: the stack of ranges it was issued in (outermost first), or None where
    it is unattributed, and how it was found (MATCHED, BETWEEN or UNATTRIBUTED)."""

    stacks: list[tuple[str, ...] | None]
    how: list[str]
    sources: list[int | None] = field(default_factory=list)  # per item, the reference item whose stack it took

    @property
    def attributed(self) -> int:
        return sum(s is not None for s in self.stacks)

    @property
    def share(self) -> float:
        return self.attributed / len(self.stacks) if self.stacks else 1.0

    def counts(self) -> dict[str, int]:
        return {h: self.how.count(h) for h in (MATCHED, BETWEEN, UNATTRIBUTED)}


def carry_over(reference: Sequence[Hashable], stacks: Sequence[tuple[str, ...]],
               calls: Sequence[Hashable | None], target: Sequence[Hashable]) -> Attribution:
    """Attribute each `target` item from the `reference` sequence whose items were issued in
    `stacks` (per item, the ranges open, outermost first). `calls[i]` tells the module call
    reference item i lies in (any value equal for items of one call, e.g. the innermost range's
    index in the trace; None for an item issued outside every range)."""
    latest, earliest = align(reference, target), align_earliest(reference, target)
    partner: list[int | None] = [
        a if a is not None and b is not None and calls[a] == calls[b] else None
        for a, b in zip(latest, earliest)]
    result: list[tuple[str, ...] | None] = [None if p is None else tuple(stacks[p]) for p in partner]
    how = [UNATTRIBUTED if p is None else MATCHED for p in partner]
    sources = list(partner)
    # the nearest matched partner before each item
    before: list[int | None] = []
    last = None
    for p in partner:
        last = p if p is not None else last
        before.append(last)
    after = None
    for j in range(len(target) - 1, -1, -1):
        if partner[j] is not None:
            after = partner[j]
            continue
        prev = before[j]
        if prev is not None and after is not None and calls[prev] is not None and calls[prev] == calls[after]:
            result[j], how[j], sources[j] = tuple(stacks[prev]), BETWEEN, prev
    return Attribution(result, how, sources)


def look_up(nodes: Mapping[int, tuple[str, ...]], node_ids: Sequence[int | None]) -> Attribution:
    """Attribute each item by the graph node it was replayed from, from the stacks recorded per
    node at capture: exact, with nothing guessed. An item with no node, or with one `nodes` does
    not hold, is unattributed."""
    stacks = [nodes.get(node) for node in node_ids]  # no node (None) is no key
    return Attribution(stacks, [UNATTRIBUTED if s is None else MATCHED for s in stacks])
