"""Before a capture on several ranks: does every rank's step issue the same collectives?

Ranks that capture different collectives (one more all-reduce on rank 0, two in another order,
another shape) deadlock or corrupt each other's data on every replay, and nothing in a capture
says so. So before any rank captures, each one runs its step once without communicating (each
collective answers with a local stand-in of the right shape) and notes the collectives in order
(op, group, shape, dtype, reduce op) and any it did not wait for; the ranks exchange their notes
(`all_gather_object`, outside the step) and all refuse together, naming the first collective
that differs and which ranks issue what.

    check_ranks_agree(lambda: model.decode_step(tokens, positions), model)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from graphrt.graphs.collectives import Collective, PendingCollectives, describe, is_collective
from graphrt.graphs.guard import GraphCaptureError
from graphrt.graphs.restore import preserved


@dataclass(frozen=True)
class IssuedCollectives:
    """What one rank's step issued, in order, and the refusal for one it left unwaited."""

    sequence: tuple[Collective, ...]
    unwaited: str | None


class _DryRun(TorchDispatchMode):
    """Runs every op but the collectives, which it notes and answers locally: a copy of the
    input where the result has its shape (all_reduce), zeros of the result's shape otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.sequence: list[Collective] = []
        self.pending = PendingCollectives()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_collective(func):
            self.sequence.append(describe(func, args, kwargs))
            out = _stand_in(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        self.pending.note(func, args, kwargs, out)
        return out


def _stand_in(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> torch.Tensor:
    """A local result for a collective, of the shape and dtype it would return."""
    sent = args[0]
    on_meta = func(sent.to("meta"), *args[1:], **kwargs)  # functional collectives have meta kernels
    if on_meta.shape == sent.shape:
        return sent.clone()
    return torch.zeros(on_meta.shape, dtype=on_meta.dtype, device=sent.device)


def issued_collectives(step: Callable[[], Any], model: nn.Module | None) -> IssuedCollectives:
    """Run `step()` once without communicating, and put back what it wrote (`preserved`)."""
    dry = _DryRun()
    with preserved(model), dry:
        step()
    return IssuedCollectives(tuple(dry.sequence), dry.pending.unwaited_error())


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"


def disagreement(issued: list[IssuedCollectives]) -> str | None:
    """Why these ranks' steps (`issued[rank]`) cannot be captured together, or None."""
    for rank, notes in enumerate(issued):
        if notes.unwaited is not None:
            return f"rank {rank}: {notes.unwaited}"
    longest = max(len(notes.sequence) for notes in issued)
    for k in range(longest):
        by_collective: dict[str, list[int]] = {}
        for rank, notes in enumerate(issued):
            what = str(notes.sequence[k]) if k < len(notes.sequence) else "no collective"
            by_collective.setdefault(what, []).append(rank)
        if len(by_collective) > 1:
            sides = "; ".join(f"{_ranks(ranks)} issue{'s' * (len(ranks) == 1)} {what}"
                              for what, ranks in by_collective.items())
            return (f"the ranks' steps issue different collectives at collective #{k + 1}: {sides} "
                    f"(every rank must capture the same collectives in the same order, or replays "
                    f"deadlock)")
    return None


def check_ranks_agree(step: Callable[[], Any], model: nn.Module | None = None) -> IssuedCollectives:
    """Refuse (GraphCaptureError, on every rank alike) a step whose collectives differ across
    the ranks of the default process group, or that leaves one unwaited; returns this rank's."""
    mine = issued_collectives(step, model)
    everyone: list[IssuedCollectives | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    problem = disagreement(everyone)
    if problem is not None:
        raise GraphCaptureError(problem)
    return mine
