"""The serving engines graphrt knows, in the order its notes and tables name them. Adding an
engine is a module of graphrt.engines that fills in an `Engine`, listed here (docs/design.md,
"Adding a serving engine")."""

from __future__ import annotations

from graphrt.engines import atom, sglang, tensorrt_llm, vllm
from graphrt.engines.engine import Engine

ENGINES: tuple[Engine, ...] = (vllm.ENGINE, sglang.ENGINE, atom.ENGINE, tensorrt_llm.ENGINE)
# those whose capture list graphrt resolves, by the name --engine-setting spells them
BY_KEY: dict[str, Engine] = {engine.key: engine for engine in ENGINES if engine.key is not None}
