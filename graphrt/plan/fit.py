"""Whether a plan's measuring fits the device, said before it starts.

What the measuring holds at once, at least (graphrt.plan.measure_sizes): the model's parameters,
a KV cache of the largest size's rows, every size's graph with its static logits [b, V] (a graph
keeps its output for as long as it lives, whatever pool it shares), and the largest size's
prefill logits [top, T, V]. Activations, workspaces and the graphs' other intermediates come on
top, so a plan this figure does not fit cannot run, and one it fits may still find the device
short: the refusal never turns away a plan that would have fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphrt.errors import GraphrtError
from graphrt.model.config import ModelConfig
from graphrt.run.footprint import size_text


@dataclass(frozen=True)
class Fit:
    sizes: tuple[int, ...]  # the sizes to measure, ascending
    parameters: int  # bytes, as each part below
    cache: int
    outputs: int  # every size's graph's static logits
    prefill: int  # the largest size's prefill logits
    free: int | None  # what the device has free; None where it cannot say
    where: str  # the device, in words ("NVIDIA H100 80GB HBM3", "this CPU")

    @property
    def needed(self) -> int:
        return self.parameters + self.cache + self.outputs + self.prefill

    def describe(self) -> str:
        """What the plan will measure, and the memory that takes at least."""
        parts = ", ".join(f"{name} {size_text(n)}" for name, n in (
            ("parameters", self.parameters), ("KV cache", self.cache), ("graphs' logits", self.outputs),
            ("largest prefill's logits", self.prefill)))
        free = "free memory unknown" if self.free is None else f"{size_text(self.free)} free on {self.where}"
        return (f"plan: measuring {len(self.sizes):,} sizes of 1..{self.sizes[-1]:,}, each eager and replayed; "
                f"at least {size_text(self.needed)} ({parts}); {free}")

    def check(self) -> None:
        """Refuse, in one line, a measuring that needs more than the device has free."""
        if self.free is not None and self.needed > self.free:
            raise GraphrtError(
                f"plan: measuring {len(self.sizes):,} sizes of 1..{self.sizes[-1]:,} needs at least "
                f"{size_text(self.needed)} and {self.where} has {size_text(self.free)} free: plan for a "
                "smaller largest batch (the traffic's, or the lists it is set against) or fewer sizes (--grid)")


def fit(config: ModelConfig, sizes: tuple[int, ...], prompt_len: int, steps: int, itemsize: int,
        free: int | None, where: str) -> Fit:
    """The least memory measuring `sizes` takes on a model of `config` in a dtype of `itemsize`
    bytes, with prompts of `prompt_len` and `steps` decode steps per size."""
    top, vocab = sizes[-1], config.vocab_size
    slots = prompt_len + steps  # the cache's length (measure_sizes.measure)
    cache = 2 * config.num_hidden_layers * top * slots * config.num_key_value_heads * config.head_dim
    return Fit(sizes, config.num_parameters() * itemsize, cache * itemsize, sum(sizes) * vocab * itemsize,
               top * prompt_len * vocab * itemsize, free, where)


def check_largest(config: ModelConfig, top: int, largest: int, prompt_len: int, steps: int, itemsize: int,
                  free: int | None, where: str) -> None:
    """Refuse a largest size `top` (the traffic's `largest` batch, or the size a list runs it as)
    whose own share of the measuring (`fit` of it alone) does not fit, before the sizes to
    measure are listed: a list up to a batch of 10^18 is never made."""
    least = fit(config, (top,), prompt_len, steps, itemsize, free, where)
    if free is not None and least.needed > free:
        runs_as = f", run as batch {top:,} by a list set against it," if top != largest else ""
        raise GraphrtError(
            f"plan: the traffic's largest batch {largest:,}{runs_as} needs at least {size_text(least.needed)} "
            f"on its own and {where} has {size_text(free)} free: plan for a smaller largest batch")
