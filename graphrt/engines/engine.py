"""What graphrt knows of a serving engine, as one record each engine's module fills in: the step
markers it writes, the settings that decide its capture list, how its server resolves that list,
and the option that takes a plan's list. Torch-free: the command line and the trace readers use it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from graphrt.engines.step_marker import Marker

Value = int | bool | str


@dataclass(frozen=True)
class Kind:
    """What a setting takes: a positive integer, true or false, or one of `choices`."""

    name: str  # "count", "flag" or "choice"
    choices: tuple[str, ...] = ()

    def parse(self, text: str) -> Value:
        """The value `text` says, or a ValueError saying what was expected."""
        if self.name == "count":
            if not text.isdigit() or int(text) < 1:
                raise ValueError("a positive integer")
            return int(text)
        if self.name == "flag":
            if text.lower() not in ("true", "false"):
                raise ValueError("true or false")
            return text.lower() == "true"
        if text not in self.choices:
            raise ValueError(f"one of {', '.join(self.choices)}")
        return text


COUNT, FLAG = Kind("count"), Kind("flag")


@dataclass(frozen=True)
class ServedOn:
    """What an engine reads of the device it serves on."""

    memory: int  # bytes
    name: str  # as the device names itself; "" where unknown
    blackwell: bool  # data-center Blackwell (compute capability 10.x)


@dataclass(frozen=True)
class EngineList:
    """One engine's capture list, as its server resolves it."""

    name: str  # the row's name, with the version its rule was read at
    sizes: tuple[int, ...]  # as the engine captures them (vLLM's count tokens, the others' requests)
    padding: bool  # a batch pads up to the next size (else it replays only at a captured size)
    # the largest decode batch the server forms (vLLM's max_num_seqs); None: every size it captures
    full_graphs_up_to: int | None
    assumed: dict[str, Value]  # every setting the list depends on, as resolved
    decode: tuple[int, ...] | None = None  # decode batches (requests) replayed as one graph; None: sizes
    speculative: bool = False  # a decode request verifies draft tokens too

    def decode_sizes(self) -> tuple[int, ...]:
        """The batch sizes (requests) a decode step can replay as one graph."""
        return self.sizes if self.decode is None else self.decode


# an engine's lists from the settings given it (name -> value), the device and the model's length
Resolve = Callable[[dict[str, Value], ServedOn, int], list[EngineList]]


@dataclass(frozen=True)
class Engine:
    """One serving engine. `read_marker`: the marker a range's name is in one of the engine's
    forms, else None (raising step_marker.PastBound where a count it states is past any batch);
    `begins`: how its markers begin, so a name that begins so and does not read as one is named
    with `forms`. An engine whose capture list graphrt does not know has no `key`, `settings`,
    `resolve` or `export`."""

    name: str  # as graphrt names it: "vLLM"
    read_marker: Callable[[str], Marker | None]
    begins: re.Pattern[str]
    forms: str  # its markers' forms, as a note names them
    # a python function (torch.profiler with stack) that is the engine's step where it wrote no marker
    runner_function: Callable[[str], bool] | None = None
    key: str | None = None  # as --engine-setting spells it: `vllm`
    settings: dict[str, Kind] = field(default_factory=dict)  # the settings that decide its capture list
    resolve: Resolve | None = None
    export: Callable[[tuple[int, ...]], dict] | None = None  # a plan's sizes in the engine's option
