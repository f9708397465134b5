"""Whether a run's decode fits the machine, said before anything is allocated.

What a run (graphrt.run.execute) holds from its start to its end, at least: the model's weights,
one KV cache of `rows` x the sequence length (rows: the batch, or under a graph mode the largest
bucket, which its capture writes whole), the prefill's logits [B, T, V] in the model's dtype, and,
for the equivalence check, every mode's logits [B, V] in fp32 of as many steps as
`LOGITS_BUDGET_BYTES` holds. Activations, workspaces and graphs come on top, so a run this figure
does not fit cannot run, and the refusal never turns away a run that would have fitted. One rank
of a tensor-parallel run holds its share (1/N) of all of it, on its GPU or beside the other ranks
in this machine's memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from graphrt.backends.choices import GRAPH_MODES, default_buckets, expand_modes
from graphrt.errors import GraphrtError
from graphrt.measure import hardware
from graphrt.model.config import ModelConfig
from graphrt.model.resolve import resolve
from graphrt.parallel import ranks
from graphrt.run.decode import LOGITS_BUDGET_BYTES
from graphrt.run.machine import resolve_device, resolve_dtype
from graphrt.run.spec import RunSpec
from graphrt.units import format_bytes


def size_text(n: float) -> str:
    """A memory figure as an estimate reads: the largest unit, thousands apart ("1,010.0 MiB")."""
    return format_bytes(n, grouped=True)


@dataclass(frozen=True)
class Footprint:
    rows: int  # KV-cache rows
    seq_len: int  # KV-cache positions per row
    weights: int  # bytes, as each part below
    cache: int
    prefill_logits: int
    kept_logits: int  # every mode's, together

    @property
    def needed(self) -> int:
        return self.weights + self.cache + self.prefill_logits + self.kept_logits

    def describe(self) -> str:
        return (f"weights {size_text(self.weights)}, KV cache {size_text(self.cache)} ({self.rows:,} rows x "
                f"{self.seq_len:,} positions), prefill logits {size_text(self.prefill_logits)}, "
                f"logits kept {size_text(self.kept_logits)}")


def cache_rows(spec: RunSpec) -> int:
    """The KV cache's rows: the batch, or under a graph mode its largest bucket (by default the
    power of two that holds the batch), as `GraphBackend.cache_rows` sizes it."""
    if not set(expand_modes(spec.mode)) & set(GRAPH_MODES):
        return spec.batch
    return max(spec.batch, (spec.buckets or default_buckets(spec.batch))[-1])


def footprint(spec: RunSpec, config: ModelConfig, itemsize: int, share: int = 1) -> Footprint:
    """The least memory one of `share` ranks holds decoding `spec` on a model of `config` whose
    dtype takes `itemsize` bytes."""
    rows, vocab, modes = cache_rows(spec), config.vocab_size, len(expand_modes(spec.mode))
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim  # K and V
    # a config that does not state its vocabulary (0: transformers reads it) holds no logits here
    kept_steps = min(spec.steps, LOGITS_BUDGET_BYTES // max(1, spec.batch * vocab * 4))
    return Footprint(rows, spec.seq_len,
                     weights=config.num_parameters() * itemsize // share,
                     cache=rows * spec.seq_len * per_position * itemsize // share,
                     prefill_logits=spec.batch * spec.prompt_len * vocab * itemsize // share,
                     kept_logits=modes * kept_steps * spec.batch * vocab * 4 // share)


def _options(spec: RunSpec) -> str:
    """The options a run's memory follows, as given."""
    said = f"--batch {spec.batch:,} --prompt-len {spec.prompt_len:,} --steps {spec.steps:,}"
    if spec.max_seq_len:
        said += f" --max-seq-len {spec.max_seq_len:,}"
    if spec.buckets and cache_rows(spec) > spec.batch:
        said += f" --buckets {','.join(map(str, spec.buckets))}"
    return said


SAID_FROM = 0.1  # the share of the free memory from which a run says what it will hold


def check_fits(spec: RunSpec) -> str | None:
    """What the run will hold at least, in a line to show before it starts where that is a tenth
    or more of what is free (else None, as where the model's positions refuse it first); a run
    that needs more memory than its device has free (on the CPU, what Linux counts as available)
    is refused in one line naming the options."""
    config, _ = resolve(spec.model, spec.impl)
    if spec.seq_len > config.max_position_embeddings:
        return None  # a cache longer than the model's positions is refused as such, when the model loads
    device = ranks.launched_device(resolve_device(spec.device).type)  # a rank's own GPU, not GPU 0
    share = spec.tp or (int(os.environ["WORLD_SIZE"]) if ranks.launched() else 1)
    need = footprint(spec, config, resolve_dtype(spec.dtype, device).itemsize, share)
    free = hardware.memory(device).free
    where = hardware.device_name(device) if device.type == "cuda" else "this machine"
    each = f" on each of its {share} ranks" if share > 1 else ""
    if free is not None and need.needed > free:
        raise GraphrtError(f"{_options(spec)}: the run needs at least {size_text(need.needed)}{each} "
                           f"({need.describe()}) and {where} has {size_text(free)} free: give a smaller --batch")
    if free is None or need.needed < SAID_FROM * free:
        return None
    return f"run: at least {size_text(need.needed)}{each} ({need.describe()}); {size_text(free)} free on {where}"
