"""ATOM: the step markers it writes. graphrt knows no rule of its capture list, so `graphrt plan`
sets no row for it and exports no option.

Markers: `prefill[bs=2 tok=14721 ctx=[…]]`, `decode[bs=64 tok=64 d=64]`,
`decode[bs=117/128 tok=117 d=117]` (117 real rows padded to a graph of 128),
`decode[bs=128 tok=384 p=2 d=126 spec=3]` (2 of the rows still prefilling).
"""

from __future__ import annotations

import re

from graphrt.engines.engine import Engine
from graphrt.engines.step_marker import ANNOTATION, FIELDS, Marker, count
from graphrt.vocab import Phase

NAME = "ATOM"
_STEP = re.compile(r"(prefill|decode)\[bs=(\d+)(?:/(\d+))?( .*)?\]", re.ASCII)  # ctx=[…] holds brackets of its own


def read_marker(name: str) -> Marker | None:
    """The marker `name` is in ATOM's forms, or None."""
    if not (m := _STEP.fullmatch(name)):
        return None
    stated, bs, padded, rest = m.groups()
    given = dict(FIELDS.findall(rest or ""))
    f = {k: count(k, v) for k, v in given.items() if k in ("tok", "p")}
    phase = Phase.MIXED if stated == Phase.DECODE and f.get("p") else Phase(stated)
    return Marker(NAME, "ATOM prefill[...]/decode[...]", ANNOTATION, phase, count("bs", bs), f.get("tok"),
                  count("bs", padded) if padded else None)


ENGINE = Engine(NAME, read_marker, re.compile(r"(prefill|decode)\["),
                "ATOM's prefill[bs=N …] or decode[bs=N …], decode[bs=N/G …]")
