"""Operators defined for the tests, one for each rule of replay (and of what an op is) that no
aten operator exercises on every machine.

- `third`: its out= overload rounds differently from the op itself (x * (1/3) against x / 3),
  whatever BLAS the machine has.
- `half`: an out= overload with a schema but no CPU kernel.
- `scaled`: no out= overload at all, and a keyword-only argument.
- `tally`: writes its first argument (a running total) and returns a new tensor, as training
  batch norm writes its running statistics; `tally_both` also returns the argument it wrote.
- `pick`: returns the memory of a keyword-only argument, a view that no aten op makes.
- `shift`: a keyword argument with a default, and an out= overload; each kernel notes in
  `KERNELS_RUN` that it ran.
- `noisy`: tagged as drawing random numbers, for a dropout given as a keyword-only argument
  that is on by default (as fused attention ops are tagged for theirs).
- `numbered` and `tally_numbered`: return a Python int next to a new tensor, and take a
  keyword-only argument (the second also writes its first argument).
"""

import torch

_LIB = torch.library.Library("graphrt_test", "DEF")
_LIB.define("third(Tensor x) -> Tensor")
_LIB.define("third.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.impl("third", lambda x: x / 3, "CPU")
_LIB.impl("third.out", lambda x, *, out: torch.mul(x, 1 / 3, out=out), "CPU")
_LIB.define("half(Tensor x) -> Tensor")
_LIB.define("half.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.impl("half", lambda x: x / 2, "CPU")
_LIB.define("scaled(Tensor x, *, float factor) -> Tensor")
_LIB.impl("scaled", lambda x, *, factor: x * factor, "CPU")


def _tally(total: torch.Tensor, x: torch.Tensor, *, factor: float) -> torch.Tensor:
    total.add_(x.sum())
    return x * factor


_LIB.define("tally(Tensor(a!) total, Tensor x, *, float factor) -> Tensor")
_LIB.impl("tally", _tally, "CPU")
_LIB.define("tally_both(Tensor(a!) total, Tensor x, *, float factor) -> (Tensor(a!), Tensor)")
_LIB.impl("tally_both", lambda total, x, *, factor: (total, _tally(total, x, factor=factor)), "CPU")
_LIB.define("pick(Tensor a, *, Tensor b) -> Tensor")
_LIB.impl("pick", lambda a, *, b: b, "CPU")

KERNELS_RUN: list[str] = []


def _shift(x: torch.Tensor, *, by: float = 1.0, out: torch.Tensor | None = None) -> torch.Tensor:
    KERNELS_RUN.append("shift" if out is None else "shift.out")
    return torch.add(x, by, out=out)


_LIB.define("shift(Tensor x, *, float by=1.0) -> Tensor")
_LIB.define("shift.out(Tensor x, *, float by=1.0, Tensor(a!) out) -> Tensor(a!)")
_LIB.impl("shift", _shift, "CPU")
_LIB.impl("shift.out", _shift, "CPU")
_LIB.define("numbered(Tensor x, *, float factor) -> (Tensor, int)")
_LIB.impl("numbered", lambda x, *, factor: (x * factor, x.numel()), "CPU")
_LIB.define("tally_numbered(Tensor(a!) total, Tensor x, *, float factor) -> (Tensor, int)")
_LIB.impl("tally_numbered", lambda total, x, *, factor: (_tally(total, x, factor=factor), x.numel()), "CPU")

_LIB.define("noisy(Tensor x, *, float dropout_p=0.5) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))
_LIB.impl("noisy", lambda x, *, dropout_p=0.5: torch.nn.functional.dropout(x * 1, dropout_p), "CPU")

ops = torch.ops.graphrt_test
