"""What a user picks of the backends, by name: the modes and the graph batch buckets.

Torch-free, so that the command line checks them and prints its help without importing torch.
"""

from __future__ import annotations

from graphrt.errors import GraphrtError
from graphrt.vocab import Mode

MODES = tuple(Mode)
GRAPH_MODES = (Mode.PIECEWISE, Mode.GRAPH)  # the modes that capture the step and replay it
GROUPS = {"both": (Mode.EAGER, Mode.GRAPH), "all": MODES}


def expand_modes(mode: str) -> tuple[Mode, ...]:
    """`both` and `all` name several modes, a comma list (`eager,piecewise,graph`) its own;
    the others one."""
    if mode in GROUPS:
        return GROUPS[mode]
    names = tuple(mode.split(","))
    if all(name in MODES for name in names) and len(set(names)) == len(names):
        return tuple(Mode(name) for name in names)
    raise GraphrtError(f"--mode must be one of {', '.join((*MODES, *GROUPS))} or a comma list of "
                       f"distinct modes, got {mode!r}")


def parse_buckets(text: str, option: str = "--buckets") -> tuple[int, ...]:
    """`--buckets 1,2,4,8` -> (1, 2, 4, 8): positive integers, strictly increasing; a bad list is
    refused naming `option`, the one that gave it."""
    try:
        buckets = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise GraphrtError(f"{option} {text!r}: expected comma-separated integers like 1,2,4,8") from None
    if any(b <= 0 for b in buckets):
        raise GraphrtError(f"{option} {text!r}: every bucket must be a positive integer")
    if any(a >= b for a, b in zip(buckets, buckets[1:])):
        raise GraphrtError(f"{option} {text!r}: buckets must be strictly increasing, no duplicates")
    return buckets


def default_buckets(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, ... up to the first power of two that holds `max_batch` (1..32 for 32)."""
    buckets = [1]
    while buckets[-1] < max_batch:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)
