"""The settings a user passes to each serving engine, as `--engine-setting ENGINE.NAME=VALUE`.

Names are spelled as each engine spells them (vLLM's and SGLang's server arguments, TensorRT-LLM's
LLM API fields, dotted inside `cuda_graph_config`; the speculative-decoding fields each engine takes
in its own JSON or YAML, dotted inside `speculative_config`); only those that decide its default
capture list are known, each in its engine's module (graphrt.engines). Torch-free: the command
line checks them at once.
"""

from __future__ import annotations

from collections.abc import Iterable

from graphrt.engines.engine import Value
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
