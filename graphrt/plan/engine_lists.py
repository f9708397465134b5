"""Each engine's default capture list as its server resolves it, from the settings a user passes
and the device it serves on, by the rules in each engine's module (graphrt.engines); and a plan's
chosen list in each engine's option.

The settings come as `--engine-setting ENGINE.NAME=VALUE`, names spelled as each engine spells them
(vLLM's and SGLang's server arguments, TensorRT-LLM's LLM API fields, dotted inside
`cuda_graph_config`; the speculative-decoding fields each engine takes in its own JSON or YAML,
dotted inside `speculative_config`); only those that decide its default capture list are known,
each in its engine's module. Torch-free: the command line checks them at once.

A list says what it assumed (the settings as resolved, given or defaulted), so a plan's reader
can tell which server each row stands for.
"""

from __future__ import annotations

from collections.abc import Iterable

from graphrt.engines.engine import EngineList, ServedOn, Value
from graphrt.engines.registry import BY_KEY
from graphrt.errors import GraphrtError

Settings = dict[str, dict[str, Value]]  # engine -> name -> value, only what was given


def parse_settings(given: Iterable[str]) -> Settings:
    """`--engine-setting` values (`vllm.max_num_seqs=256`, ...) by engine and name; a malformed
    one, an unknown engine or name, a bad value or a name given twice is refused in one line."""
    settings: Settings = {key: {} for key in BY_KEY}
    for text in given:
        where = f"--engine-setting {text}"
        key, equals, value = text.partition("=")
        engine, dot, name = key.partition(".")
        if not (equals and dot and name and value):
            raise GraphrtError(f"{where}: expected ENGINE.NAME=VALUE, such as vllm.max_num_seqs=256")
        if engine not in BY_KEY:
            raise GraphrtError(f"{where}: no engine {engine!r}; expected one of {', '.join(BY_KEY)}")
        known = BY_KEY[engine].settings
        if name not in known:
            raise GraphrtError(f"{where}: {BY_KEY[engine].name} has no setting {name!r} that decides its "
                               f"capture list; expected one of {', '.join(known)}")
        if name in settings[engine]:
            raise GraphrtError(f"{where}: {engine}.{name} is given twice")
        try:
            settings[engine][name] = known[name].parse(value)
        except ValueError as expected:
            raise GraphrtError(f"{where}: expected {expected}") from None
    return settings


def said(assumed: dict[str, Value]) -> str:
    """Settings as `name value, ...`, true and false as the engines' YAML spells them."""
    return ", ".join(f"{name} {str(value).lower() if isinstance(value, bool) else value}"
                     for name, value in assumed.items())


def engine_lists(settings: Settings, device: ServedOn, max_model_len: int) -> list[EngineList]:
    """Every engine's list for `settings` (engine -> name -> value, as given) on `device`."""
    return [listed for key, engine in BY_KEY.items() if engine.resolve is not None
            for listed in engine.resolve(settings.get(key, {}), device, max_model_len)]


def exports(sizes: tuple[int, ...]) -> dict[str, dict]:
    """`sizes` as each engine takes them (each engine's module names its option), and as
    graphrt's --buckets."""
    listed = {key: engine.export(sizes) for key, engine in BY_KEY.items() if engine.export is not None}
    return {**listed, "graphrt": {"buckets": list(sizes), "cli": "--buckets " + ",".join(map(str, sizes))}}
