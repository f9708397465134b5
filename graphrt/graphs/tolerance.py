"""When a replayed value differs from eager's: graphrt's one definition.

Integers and booleans differ where any element is unequal. Floating values differ beyond
rounding: where `max |Δ| > atol + rtol × max |eager|`, with (atol, rtol) stated per dtype and
`max |eager|` the largest finite magnitude of the whole eager value, so the bound scales with
the size of the output rather than of each element (an element near zero that rounds
differently is not a difference; a real error, orders of magnitude larger, is). Element by
element, before any tolerance:

- equal values are no difference: `-0.0` equals `0.0`, `inf` equals `inf`;
- `nan` where eager has `nan` is no difference (the same computation made it);
- `nan` against a number, or `inf` against `-inf` or a number, is `|Δ| = inf`: always beyond;
- a subnormal against zero is a difference exactly, and within any atol.

The run's equivalence line (its logits), the run's trigger for localizing, and the localizer's
judgement of each probe all use `compare_values`; `graphrt.testing`'s comparison keeps the
caller's own atol/rtol.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

Tolerances = Mapping[torch.dtype, tuple[float, float]]  # dtype -> (atol, rtol)

# A tape replays the very ops eager ran: at the same shapes, the same bits, so any difference is
# the bug. A batch padded to its bucket is another GEMM shape, whose kernel (on a CPU as with
# cuBLAS) may sum in another order, and a CUDA graph may run other kernels than eager: results
# that differ in the last bits. These leave room for that, not for a bug, which is larger by
# orders of magnitude: one unit in the last place is at most 2^-7 × max |eager| in bfloat16,
# 2^-10 × in float16, 2^-23 × in float32.
EXACT: Tolerances = {}
LAST_BITS: Tolerances = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1e-2),
}


def tolerances_for(kind: str, padded: bool = False) -> Tolerances:
    """The tolerances a graph of `kind` ("tape" or "cuda") is compared with eager under;
    `padded`: it runs a batch padded to a larger bucket."""
    return EXACT if kind == "tape" and not padded else LAST_BITS


@dataclass(frozen=True)
class ValueDifference:
    """Where and how far a value differs from eager's."""

    index: tuple[int, ...]  # the element whose |Δ| is largest; () for a scalar or other shapes
    max_abs_diff: float  # inf where nan meets a number, or where the shapes or dtypes differ
    limit: str  # what it exceeds, in words; where the shapes or dtypes differ, how

    @property
    def element(self) -> str:
        """`row 0, column 30` on a 2-D value, `row 5` on a 1-D one, else `element (0, 0, 7)`."""
        if len(self.index) == 2:
            return f"row {self.index[0]}, column {self.index[1]}"
        if len(self.index) == 1:
            return f"row {self.index[0]}"
        return f"element {self.index}" if self.index else ""

    def describe(self) -> str:
        """`row 0, column 30, max |Δ| 0.25 > atol 1e-05 + rtol 1e-05 × max |eager| 3.1`."""
        how = self.limit if math.isinf(self.max_abs_diff) and self.limit.startswith("shape") \
            else f"max |Δ| {self.max_abs_diff:.3g} > {self.limit}"
        return f"{self.element}, {how}" if self.element else how


def compare_values(eager: torch.Tensor, replay: torch.Tensor, tolerances: Tolerances,
                   rows: int | None = None) -> ValueDifference | None:
    """Where `replay` differs from `eager` beyond its dtype's tolerance (see the module's rule);
    None where it does not. `rows`: compare only the first rows of a replayed value whose first
    dimension is longer than eager's `rows` (a graph padded to its bucket)."""
    if rows is not None and replay.dim() and eager.dim() and replay.shape[0] > eager.shape[0] == rows:
        replay = replay[:rows]
    if eager.shape != replay.shape or eager.dtype != replay.dtype:
        return ValueDifference((), math.inf, f"shape or dtype: {replay.dtype} {list(replay.shape)}, "
                                             f"eager's {eager.dtype} {list(eager.shape)}")
    if eager.numel() == 0:
        return None
    same = eager == replay  # on the values' own dtype: exact for any integer
    if eager.is_floating_point():
        same |= eager.isnan() & replay.isnan()
    unequal = ~same
    if not unequal.any():
        return None
    # |Δ| of each unequal element (nan against a number: inf); -1 marks the equal ones
    diff = (eager.double() - replay.double()).abs().nan_to_num(nan=math.inf, posinf=math.inf)
    diff = torch.where(unequal, diff, -1.0)
    tolerance = tolerances.get(eager.dtype) if eager.is_floating_point() else None
    if tolerance is None:
        limit, bound = "0 (exact)", -1.0  # any unequal element, even one double cannot tell apart
    else:
        atol, rtol = tolerance
        finite = eager.double().abs()[eager.isfinite()]
        scale = float(finite.max()) if finite.numel() else 0.0
        limit, bound = f"atol {atol:g} + rtol {rtol:g} × max |eager| {scale:.3g}", atol + rtol * scale
    largest = float(diff.max())
    if largest <= bound:
        return None
    worst = int(diff.reshape(-1).argmax())
    index = tuple(int(k) for k in torch.unravel_index(torch.tensor(worst), eager.shape)) if eager.dim() else ()
    return ValueDifference(index, max(largest, 0.0), limit)
