"""What a step marker states, in the words every engine's forms speak: the `Marker`, its tier
where markers nest, the phases it names, and the counts it may state.

graphrt.trace.analysis.markers reads a range's name with each engine's forms (graphrt.engines.registry)
and decides which markers are steps; an engine's module says only what its own forms state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from graphrt.vocab import Mode, Phase

ANNOTATION, RUNNER_FUNCTION, PROFILER_ITERATION = 1, 2, 3  # tiers: the lower wins where markers nest
# engines hold a step's rows and tokens in int32 tensors (positions, slot maps, grid sizes): no
# marker of theirs states a count from 2**31 up
COUNT_BOUND = 2**31
FIELDS = re.compile(r"([a-z_]+)=(\d+)", re.ASCII)  # `key=N` fields, as SGLang and ATOM append them


@dataclass(frozen=True)
class Marker:
    """What one marker states. `requests`: the step's batch, as requests (rows) it ran; `tokens`:
    the tokens it ran, where the marker gives them; `padded_to`: the graph size the batch was
    padded up to, where the marker says; `mode`: eager/graph/piecewise where the marker itself
    says how the step ran (graphrt's own), else None."""

    engine: str
    form: str  # the marker's form, as the output names it: "SGLang step[...]"
    tier: int
    phase: Phase = Phase.UNKNOWN
    requests: int | None = None
    tokens: int | None = None
    padded_to: int | None = None
    mode: Mode | None = None


class PastBound(ValueError):
    """A count no engine writes: `field` stated as `digits`, which are `reason`."""

    def __init__(self, field: str, digits: str, reason: str = "past any batch (engines count below 2**31)"):
        super().__init__(f"{field}={digits}: {reason}")
        self.field, self.digits, self.reason = field, digits, reason


def count(field: str, digits: str) -> int:
    """A count a marker states, as ASCII digits; PastBound from COUNT_BOUND up (told by the
    digits first: Python makes no int of more than 4,300 of them)."""
    if len(digits) > 10 or (n := int(digits)) >= COUNT_BOUND:
        raise PastBound(field, digits)
    return n


def phase_of(prefilling: int, decoding: int) -> Phase:
    """The phase of a step that ran `prefilling` requests in prefill and `decoding` in decode."""
    if prefilling and decoding:
        return Phase.MIXED
    return Phase.PREFILL if prefilling else Phase.DECODE if decoding else Phase.IDLE
