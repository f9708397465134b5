"""Command-line options that choose what to decode, shared by `run` and `trace` (and the model's
by `lint`)."""

from __future__ import annotations

from typing import Callable

import click

from graphrt.backends.choices import parse_buckets
from graphrt.cli.option_types import SEED
from graphrt.model.config import IMPLEMENTATIONS, PRESETS
from graphrt.run.spec import RunSpec


# the model, its forward, its experts implementation, the device and dtype
_MODEL_OPTIONS = [
    click.option("--model", default=RunSpec.model, show_default=True,
                 help=f"Preset ({', '.join(PRESETS)}) or a Hugging Face model directory."),
    click.option("--impl", type=click.Choice(IMPLEMENTATIONS), default=RunSpec.impl, show_default=True,
                 help="Which forward decodes: graphrt's lean step (qwen2, qwen3, llama), hf: "
                 "transformers' own forward and StaticCache (any decoder-only causal LM), or auto: "
                 "lean where it can run the model, else hf."),
    click.option("--experts", help="A model with experts on transformers' forward: its experts "
                 "implementation (eager, batched_mm, grouped_mm) [default: one a graph can capture]."),
    click.option("--device", default=RunSpec.device, show_default=True, help="auto, cpu or cuda."),
    click.option("--dtype", default=RunSpec.dtype, show_default=True,
                 help="auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16 or float16."),
]


def model_options(command: Callable) -> Callable:
    """The model, its forward, its experts implementation, the device and dtype, as `RunSpec`
    fields: what `run`, `trace` and `lint` share."""
    return _apply(_MODEL_OPTIONS, command)


def _apply(options: list[Callable], command: Callable) -> Callable:
    for option in reversed(options):
        command = option(command)
    return command


def decode_options(steps: int, steps_help: str, warmup_help: str) -> Callable:
    """The model, device, shapes, seed and graph buckets of a decode, as `RunSpec` fields."""
    options = [
        *_MODEL_OPTIONS,
        click.option("--batch", type=int, default=RunSpec.batch, show_default=True),
        click.option("--prompt-len", type=int, default=RunSpec.prompt_len, show_default=True),
        click.option("--steps", type=int, default=steps, show_default=True, help=steps_help),
        click.option("--warmup", type=int,
                     help=f"{warmup_help} [default: a quarter of the steps, 1 to 4]."),
        click.option("--seed", type=SEED, default=RunSpec.seed, show_default=True,
                     help="Seeds the prompt and, for presets, the random weights."),
        click.option("--buckets",  # an empty list is refused by name, not taken as the default
                     callback=lambda ctx, param, value: None if value is None else parse_buckets(value),
                     help="Graph batch buckets, e.g. 1,2,4,8 [default: 1,2,4,… up to the batch]."),
        click.option("--lint/--no-lint", default=RunSpec.lint, show_default=True,
                     help="Before capturing, check that the step has nothing a graph would "
                     "replay wrongly (a Python value, a host tensor, ...); a finding refuses that mode in "
                     "one line, and the other modes run."),
        click.option("--tp", type=click.IntRange(min=1), default=RunSpec.tp,
                     help="Tensor-parallel ranks, started through torch.distributed's launcher (gloo "
                     "on the CPU, NCCL with one GPU per rank) [default: as many as torchrun started, else 1]."),
    ]

    return lambda command: _apply(options, command)
