"""The words graphrt's figures are filed under, each spelled once: how a step ran (`Mode`), what it
did (`Phase`), and `UNKNOWN`, what a trace does not say.

Both are `StrEnum`s: a member is the string it spells, so it compares, hashes, prints and goes into
JSON exactly as that string did (`Mode.GRAPH == "graph"`, `json.dumps` writes "graph").
"""

from __future__ import annotations

from enum import StrEnum

UNKNOWN = "unknown"  # a name (a phase, a step's mode) the trace does not state; a figure it cannot tell is None


class Mode(StrEnum):
    """How a decode step runs: each step itself, graphs around eager attention, one graph, or
    torch.compile's reduce-overhead (the peer). A traced step may also be `IDLE` or `UNKNOWN`
    (`STEP_MODES`)."""

    EAGER = "eager"
    PIECEWISE = "piecewise"
    GRAPH = "graph"
    COMPILE = "compile"


IDLE = "idle"  # a traced step that launched nothing: no mode to say, and not an eager step

# what a traced step's launches show it ran as, in the order tables list them
STEP_MODES = (Mode.EAGER, Mode.PIECEWISE, Mode.GRAPH, IDLE, UNKNOWN)


class Phase(StrEnum):
    """What a serving engine's step did, as its marker states it, in the order tables list them."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"  # prefill and decode rows in one step
    IDLE = "idle"  # no request ran
    VERIFY = "verify"  # speculative decoding: the target model checks the draft's tokens
    DRAFT = "draft"  # speculative decoding: the draft model proposes them
    UNKNOWN = UNKNOWN
