"""The settings a user passes to each serving engine, as `--engine-setting ENGINE.NAME=VALUE`.

Names are spelled as each engine spells them (vLLM's and SGLang's server arguments, TensorRT-LLM's
LLM API fields, dotted inside `cuda_graph_config`; the speculative-decoding fields each engine takes
in its own JSON or YAML, dotted inside `speculative_config`); only those that decide its default
capture list are known here (graphrt.plan.engine_lists reads them). Torch-free: the command line checks
them at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from graphrt.errors import GraphrtError

Value = int | bool | str
Settings = dict[str, dict[str, Value]]  # engine -> name -> value, only what was given

ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "tensorrt_llm": "TensorRT-LLM"}


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
# SGLang 0.5.23's built-in --speculative-algorithm values (sglang/srt/arg_groups/fields/spec.py)
SGLANG_SPECULATIVE = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
KNOWN: dict[str, dict[str, Kind]] = {
    "vllm": {"max_num_seqs": COUNT, "max_num_batched_tokens": COUNT, "max_model_len": COUNT,
             "performance_mode": Kind("choice", ("balanced", "interactivity", "throughput")),
             "cudagraph_mode": Kind("choice", ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY")),
             "speculative_config.num_speculative_tokens": COUNT},
    "sglang": {"max_running_requests": COUNT, "cuda_graph_max_bs_decode": COUNT,
               "disable_cuda_graph_padding": FLAG, "tp_size": COUNT,
               "speculative_algorithm": Kind("choice", SGLANG_SPECULATIVE)},
    "tensorrt_llm": {"max_batch_size": COUNT, "max_num_tokens": COUNT,
                     "cuda_graph_config.max_batch_size": COUNT, "cuda_graph_config.enable_padding": FLAG,
                     "speculative_config.max_draft_len": COUNT},
}


def parse_settings(given: Iterable[str]) -> Settings:
    """`--engine-setting` values (`vllm.max_num_seqs=256`, ...) by engine and name; a malformed
    one, an unknown engine or name, a bad value or a name given twice is refused in one line."""
    settings: Settings = {engine: {} for engine in KNOWN}
    for text in given:
        where = f"--engine-setting {text}"
        key, equals, value = text.partition("=")
        engine, dot, name = key.partition(".")
        if not (equals and dot and name and value):
            raise GraphrtError(f"{where}: expected ENGINE.NAME=VALUE, such as vllm.max_num_seqs=256")
        if engine not in KNOWN:
            raise GraphrtError(f"{where}: no engine {engine!r}; expected one of {', '.join(KNOWN)}")
        if name not in KNOWN[engine]:
            raise GraphrtError(f"{where}: {ENGINES[engine]} has no setting {name!r} that decides its "
                               f"capture list; expected one of {', '.join(KNOWN[engine])}")
        if name in settings[engine]:
            raise GraphrtError(f"{where}: {engine}.{name} is given twice")
        try:
            settings[engine][name] = KNOWN[engine][name].parse(value)
        except ValueError as expected:
            raise GraphrtError(f"{where}: expected {expected}") from None
    return settings
