"""Bench scenarios: a declarative TOML file that names what `graphrt bench` sweeps.

Schema (every key at the top level; unknown keys are errors):

    name            str    what results are called            [default: the file's stem]
    description     str    one line for the reader            [default: ""]
    models          [str]  presets or Hugging Face model directories (required)
    device          str    auto, cpu or cuda                  [default: auto]
    dtype           str    auto, float32, bfloat16 or float16 [default: auto: bf16 on CUDA, fp32 on CPU]
    modes           [str]  from eager, piecewise, graph, compile [default: eager, graph]
    batch_sizes     [int]  sequences decoded together (required)
    context_lengths [int]  cached tokens the first measured step attends over (required)
    tp              [int]  tensor-parallel ranks; a point with tp > 1 runs its ranks through
                           torch.distributed's launcher, as `graphrt run --tp` does [default: [1]]
    prompt_len      int    tokens prefilled eagerly; at most the smallest context [default: 16]
    steps           int    timed decode steps per repeat      [default: 64]
    warmup          int    untimed decode steps before them, at least 1 [default: 8]
    repeats         int    times each point and mode is measured, modes interleaved [default: 3]
    seed            int    prompt and random weights          [default: 0]
    peer            bool   also time Hugging Face transformers' eager decode with a StaticCache,
                           where transformers is installed    [default: true]
    max_spread      float  (p90 - p10) / median above which a point is flagged noisy [default: 0.25]
    threads         int    CPU threads for torch ops while the sweep runs; 0 leaves torch's
                           default (one per core)                [default: 0]

The sweep is models x tp x context_lengths x batch_sizes, in that order. At each point the prompt
fills slots 0..prompt_len-1 and decoding starts at position `context` (the slots between stay
as they are; a step's cost depends on its shapes, not on cached values), so the cache holds
`context + warmup + steps` positions: every decode step of a repeat fits.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from graphrt.backends.choices import MODES
from graphrt.errors import GraphrtError
from graphrt.model.config import DTYPES


@dataclass(frozen=True)
class Point:
    """One cell of the sweep."""

    model: str
    batch: int
    context: int
    tp: int = 1

    @property
    def label(self) -> str:
        ranks = f" tp {self.tp}" if self.tp > 1 else ""
        return f"{self.model}{ranks} batch {self.batch} context {self.context}"


@dataclass(frozen=True)
class Scenario:
    name: str
    models: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    context_lengths: tuple[int, ...]
    description: str = ""
    device: str = "auto"
    dtype: str = "auto"
    modes: tuple[str, ...] = ("eager", "graph")
    prompt_len: int = 16
    steps: int = 64
    warmup: int = 8
    repeats: int = 3
    seed: int = 0
    peer: bool = True
    max_spread: float = 0.25
    threads: int = 0
    tp: tuple[int, ...] = (1,)
    # not TOML keys: the file it was read from, and what the command line changed
    source: str = ""
    max_points: int | None = None  # run only the first points of the sweep
    overridden: tuple[str, ...] = ()

    @property
    def decode_steps(self) -> int:
        """Decode steps per repeat, untimed warmup included."""
        return self.warmup + self.steps

    def max_seq_len(self, point: Point) -> int:
        return point.context + self.decode_steps

    def points(self) -> list[Point]:
        points = [Point(m, b, c, tp) for m in self.models for tp in self.tp for c in self.context_lengths
                  for b in self.batch_sizes]
        return points[: self.max_points]

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# key -> (type the TOML value must have, element type for lists)
_SCHEMA: dict[str, tuple[type, type | None]] = {
    "name": (str, None), "description": (str, None), "models": (list, str),
    "device": (str, None), "dtype": (str, None), "modes": (list, str),
    "batch_sizes": (list, int), "context_lengths": (list, int), "prompt_len": (int, None),
    "steps": (int, None), "warmup": (int, None), "repeats": (int, None), "seed": (int, None),
    "peer": (bool, None), "max_spread": (float, None), "threads": (int, None), "tp": (list, int),
}
_REQUIRED = ("models", "batch_sizes", "context_lengths")
_TOML_TYPE = {str: "a string", int: "an integer", bool: "true or false", float: "a number",
              list: "a list"}
_PLURAL = {str: "strings", int: "integers"}


def _is(value: Any, kind: type) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def _check_types(where: str, raw: dict[str, Any]) -> None:
    for key, value in raw.items():
        if key not in _SCHEMA:
            raise GraphrtError(f"{where}: unknown key {key!r} (expected one of {', '.join(_SCHEMA)})")
        kind, element = _SCHEMA[key]
        if not _is(value, kind):
            raise GraphrtError(f"{where}: {key} must be {_TOML_TYPE[kind]}, got {value!r}")
        if element is not None:
            if not value:
                raise GraphrtError(f"{where}: {key} is empty; list at least one value")
            bad = [v for v in value if not _is(v, element)]
            if bad:
                raise GraphrtError(f"{where}: {key} must be a list of {_PLURAL[element]}, "
                                   f"got {bad[0]!r}")
            if len(set(value)) != len(value):
                raise GraphrtError(f"{where}: {key} lists a value twice: {value!r}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise GraphrtError(f"{where}: missing key(s) {', '.join(missing)}")


def validate(scenario: Scenario) -> Scenario:
    """Check values (types are checked on reading); return the scenario for chaining."""
    where = scenario.source or scenario.name
    for key in ("batch_sizes", "context_lengths", "tp"):
        bad = [v for v in getattr(scenario, key) if v <= 0]
        if bad:
            raise GraphrtError(f"{where}: {key} must be positive integers, got {bad[0]}")
    for key in ("prompt_len", "steps", "repeats"):
        if getattr(scenario, key) <= 0:
            raise GraphrtError(f"{where}: {key} must be a positive integer, got {getattr(scenario, key)}")
    if scenario.steps < 2:
        raise GraphrtError(f"{where}: steps must be at least 2 for a distribution, got {scenario.steps}")
    if scenario.warmup < 1:
        raise GraphrtError(f"{where}: warmup must be at least 1 (the first step counts ops, "
                           f"untimed), got {scenario.warmup}")
    if scenario.prompt_len > min(scenario.context_lengths):
        raise GraphrtError(f"{where}: prompt_len {scenario.prompt_len} exceeds the smallest "
                           f"context length {min(scenario.context_lengths)}")
    if scenario.device not in ("auto", "cpu", "cuda"):
        raise GraphrtError(f"{where}: device must be auto, cpu or cuda, got {scenario.device!r}")
    if scenario.dtype not in ("auto", *DTYPES):
        raise GraphrtError(f"{where}: dtype must be auto or one of {', '.join(DTYPES)}, "
                           f"got {scenario.dtype!r}")
    unknown = [m for m in scenario.modes if m not in MODES]
    if unknown:
        raise GraphrtError(f"{where}: modes: {unknown[0]!r} is not one of {', '.join(MODES)}")
    if scenario.threads < 0:
        raise GraphrtError(f"{where}: threads must be 0 (torch's default) or positive, got {scenario.threads}")
    if scenario.max_points is not None and scenario.max_points < 1:
        raise GraphrtError(f"--max-points must be a positive integer, got {scenario.max_points}")
    if not scenario.max_spread > 0:
        raise GraphrtError(f"{where}: max_spread must be positive, got {scenario.max_spread}")
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; every problem is a GraphrtError naming file and key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise GraphrtError(f"{path}: no such scenario file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise GraphrtError(f"{path}: cannot read it ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise GraphrtError(f"{path}: invalid TOML ({e})") from None
    _check_types(str(path), raw)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    if "max_spread" in values:
        values["max_spread"] = float(values["max_spread"])
    values.setdefault("name", path.stem)
    return validate(Scenario(**values, source=str(path)))


def with_overrides(scenario: Scenario, **overrides: int | None) -> Scenario:
    """The scenario with command-line overrides of its fields (None: keep), validated again;
    `overridden` names them, so a result says it did not run the file as written."""
    changes = {k: v for k, v in overrides.items() if v is not None}
    return validate(replace(scenario, **changes, overridden=(*scenario.overridden, *changes)))
