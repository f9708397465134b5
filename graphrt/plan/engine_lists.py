"""Each engine's default capture list as its server resolves it, from the settings a user passes
(graphrt.plan.engine_settings) and the device it serves on, by the rules in each engine's module
(graphrt.engines); and a plan's chosen list in each engine's option.

A list says what it assumed (the settings as resolved, given or defaulted), so a plan's reader
can tell which server each row stands for.
"""

from __future__ import annotations

from graphrt.engines.engine import EngineList, ServedOn, Value
from graphrt.engines.registry import BY_KEY
from graphrt.plan.engine_settings import Settings


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
