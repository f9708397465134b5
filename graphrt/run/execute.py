"""One `graphrt run`: resolve the spec, build the model once, decode through each mode."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from graphrt.backends.base import Backend
from graphrt.backends.choices import GRAPH_MODES, expand_modes
from graphrt.backends.factory import make_backend
from graphrt.errors import GraphrtError, first_line
from graphrt.backends.graph import LintRefusal
from graphrt.graphs import GraphCaptureError
from graphrt.graphs.agree import check_ranks_agree
from graphrt.graphs.localize import Localization
from graphrt.measure import nvtx
from graphrt.measure.collective_share import measure_on
from graphrt.measure.launches import StepLaunches
from graphrt.model.config import ModelConfig
from graphrt.model.resolve import resolve
from graphrt.model.weights import load_model
from graphrt.parallel import ranks as ranks_
from graphrt.parallel.ranks import Ranks
from graphrt.run import rank_figures
from graphrt.run.decode import Generation, count_launches, decode, first_step_inputs, pad_rows, random_prompt
from graphrt.run.diagnose import locate_differences
from graphrt.run.machine import machine, resolve_device, resolve_dtype
from graphrt.run.spec import RunSpec


@dataclass
class RunResult:
    spec: RunSpec
    config: ModelConfig
    device: torch.device
    dtype: torch.dtype
    prompt: torch.Tensor
    generations: dict[str, Generation] = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    # HF transformers' eager step on the same config and weights, counted like the modes' steps;
    # None with the reason in `reference_note` where transformers cannot run here
    reference_launches: StepLaunches | None = None
    reference_note: str | None = None
    # per graph mode whose tokens or logits differ from eager's: where its replay first differs
    localizations: dict[str, Localization] = field(default_factory=dict)
    ranks: Ranks | None = None  # this process's place in a tensor-parallel run
    # per mode, every rank's figures (tensor-parallel runs only)
    per_rank: dict[str, list[rank_figures.RankFigures]] = field(default_factory=dict)
    # per mode that could not capture the step: why, in one line naming the module and op
    refused: dict[str, str] = field(default_factory=dict)
    # transformers' experts implementation the model ran (None: a model without experts)
    experts: str | None = None


def load(spec: RunSpec, ranks: Ranks | None = None
         ) -> tuple[ModelConfig, torch.nn.Module, torch.device, torch.dtype]:
    """The spec's model with weights (with `ranks`: this rank's share of them)."""
    config, checkpoint = resolve(spec.model, spec.impl)
    if spec.seq_len > config.max_position_embeddings:
        raise GraphrtError(f"sequence length {spec.seq_len} exceeds {config.name}'s "
                           f"max_position_embeddings {config.max_position_embeddings}")
    _check_prompt(spec, config)  # before any weights are read
    device = ranks.device if ranks is not None else resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    model = load_model(config, device, dtype, checkpoint, spec.seed, ranks, spec.experts)
    return config, model, device, dtype


def _check_prompt(spec: RunSpec, config: ModelConfig) -> None:
    """Given prompt ids the model cannot take, refused in one line."""
    if not spec.prompt_ids:
        return
    outside = max(max(row) for row in spec.prompt_ids)
    if outside >= config.vocab_size:
        raise GraphrtError(f"--prompt: token id {outside} is outside {config.name}'s vocabulary "
                           f"of {config.vocab_size}; is the tokenizer this model's?")
    if not config.lean and len({len(row) for row in spec.prompt_ids}) > 1:
        raise GraphrtError(f"--prompt: rows of {sorted({len(row) for row in spec.prompt_ids})} tokens; "
                           f"{config.name} runs on transformers' StaticCache, which writes every row at one "
                           "position: give prompts of one length")


def _prompt(spec: RunSpec, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The prompt batch [B, T] and, for given ids, each row's length (rows are right-padded)."""
    if not spec.prompt_ids:
        return random_prompt(spec.batch, spec.prompt_len, config.vocab_size, spec.seed), None
    return pad_rows(spec.prompt_ids)


def run(spec: RunSpec, on_mode: Callable[[str], None] | None = None,
        on_done: Callable[[RunResult, str], None] | None = None) -> RunResult:
    """Decode the same prompt through every mode of the spec, on one model and one cache.

    Every mode is timed first, then every mode's step is counted in one go (`count_launches`): the
    profiler that counts them on CUDA would otherwise tax the modes timed after it, and only a
    process's first profiler session links graph kernels to their launches. Last, a graph mode
    whose output differs from eager's is localized (graphrt.run.diagnose). `on_done`
    sees the result after each mode's decode, so a later failure loses nothing already measured.

    Started by torch.distributed's launcher, this process is one rank of a tensor-parallel run:
    it joins the group, decodes its share, and every rank's figures are gathered after each
    mode (`result.per_rank`). The graphs are gone before the group is left (NCCL hangs otherwise).
    """
    ranks = join_ranks(spec)
    result = _run(spec, ranks, on_mode, on_done)
    # The backends and their graphs went with _run's frame; a failure leaves the group to the
    # process's exit instead, as its traceback still holds them.
    if ranks is not None:
        ranks_.leave()
    return result


def join_ranks(spec: RunSpec) -> Ranks | None:
    """This process's ranks when the launcher started it; None for a single-process run."""
    if not ranks_.launched():
        return None
    ranks = ranks_.join(resolve_device(spec.device).type)
    if spec.tp and spec.tp != ranks.world:
        raise GraphrtError(f"--tp {spec.tp}, but the launcher started {ranks.world} ranks")
    return ranks


def _rank_figures(backend: Backend, gen: Generation, ranks: Ranks, position: int) -> list[rank_figures.RankFigures]:
    """This mode's figures of every rank, with one more step profiled for its collectives."""
    with torch.inference_mode():
        tokens, positions = first_step_inputs(gen, position, ranks.device)
        share = rank_figures.collective_share(lambda: backend.step(tokens, positions), ranks.device,
                                          backend.countable_on_cpu)
    mine = rank_figures.RankFigures(ranks.rank, tuple(gen.step_ms), gen.launches and gen.launches.ops, share,
                               tuple(map(tuple, gen.tokens.tolist())), measure_on(ranks.device.type))
    return rank_figures.gather(mine)


def _run(spec: RunSpec, ranks: Ranks | None, on_mode: Callable[[str], None] | None,
         on_done: Callable[[RunResult, str], None] | None) -> RunResult:
    config, model, device, dtype = load(spec, ranks)
    modes = expand_modes(spec.mode)
    # made before anything runs: a backend that cannot run here (no compiler) says so now
    backends: list[Backend] = [make_backend(m, model, spec.buckets, spec.lint) for m in modes]
    model.setup_cache(max(b.cache_rows(spec.batch) for b in backends), spec.seq_len)
    prompt, lengths = _prompt(spec, config)
    result = RunResult(spec, config, device, dtype, prompt, machine=machine(device), ranks=ranks,
                       experts=getattr(model, "experts", None))
    if ranks is not None:
        # before any mode issues a real collective: ranks whose steps disagree would wait forever
        tokens = torch.zeros(spec.batch, 1, dtype=torch.long, device=device)
        positions = torch.full((spec.batch,), spec.prompt_len, dtype=torch.long, device=device)
        with torch.inference_mode():
            check_ranks_agree(lambda: model.decode_step(tokens, positions), model)
    was_enabled = nvtx.set_enabled(spec.nvtx)  # --no-nvtx lasts for this run only
    try:
        with nvtx.attach(model):
            for backend in backends:
                if on_mode:
                    on_mode(backend.name)
                try:
                    report = backend.prepare(spec.batch)
                except GraphCaptureError as refusal:  # the other modes still run
                    result.refused[backend.name] = f"the capture refused the step: {refusal_line(refusal)}"
                    continue
                try:
                    gen = decode(backend, prompt, spec.steps, spec.warmup, lengths=lengths)
                except (RuntimeError, IndexError) as failure:
                    if backend.name not in GRAPH_MODES:
                        raise
                    # a step captured without the lint (--no-lint) that its replay cannot run
                    result.refused[backend.name] = f"its replay failed: {first_line(failure)}"
                    _check_device_usable(device, backend.name, failure)
                    continue
                gen.prepare = report
                result.generations[backend.name] = gen
                if on_done:
                    on_done(result, backend.name)
            backends = [b for b in backends if b.name in result.generations]
            _count(result, backends, model)
            if ranks is not None:
                for backend in backends:
                    result.per_rank[backend.name] = _rank_figures(
                        backend, result.generations[backend.name], ranks, spec.prompt_len)
            if ranks is None:  # localizing replays one rank's step: its collectives would wait alone
                result.localizations = locate_differences(result.generations, model, dtype, result.prompt,
                                                          spec.buckets, lengths)
    finally:
        nvtx.set_enabled(was_enabled)
    return result


def _check_device_usable(device: torch.device, mode: str, failure: BaseException) -> None:
    """After a replay failed: on CUDA an illegal address or a device-side assert leaves the
    device unusable, and every later mode would fail on it, blamed for the first. Stop here, in
    one line, where the device no longer answers."""
    if device.type != "cuda":
        return
    try:
        torch.cuda.synchronize(device)
    except RuntimeError as error:
        raise GraphrtError(f"{mode}'s replay failed ({first_line(failure)}) and left the device unusable "
                           f"({first_line(error)}); no later mode can run in this process") from None


def refusal_line(refusal: GraphCaptureError) -> str:
    """A capture's refusal in one line: the lint's first finding, or the op the capture refused."""
    if isinstance(refusal, LintRefusal):
        return refusal.one_line()
    return str(refusal).splitlines()[0]


def _count(result: RunResult, backends: list[Backend], model: torch.nn.Module) -> None:
    """One more step of each mode, and of HF's step for scale where it can run, counted last
    and all in one profiler session (graphrt.measure.launches.count_steps)."""
    counted = [(b, result.generations[b.name]) for b in backends]
    reference, result.reference_note = _reference_backend(model, result.prompt, result.ranks)
    if reference is not None:
        counted.append((reference, counted[0][1]))
    launches = count_launches(counted, result.spec.prompt_len)
    result.reference_launches = launches.pop(reference.name) if reference is not None else None
    for name, counts in launches.items():
        result.generations[name].launches = counts


def _reference_backend(model: torch.nn.Module, prompt: torch.Tensor, ranks: Ranks | None
                       ) -> tuple[Backend | None, str | None]:
    """HF transformers' eager step (the bench's peer: StaticCache, the same weights), prefilled
    with the prompt, so its next step is the one graphrt's modes counted; or why it cannot run."""
    from graphrt.backends import peer

    if ranks is not None:
        return None, "not under --tp: HF's step needs the whole model, a rank holds a share"
    if not model.config.lean:
        return None, "the model runs on transformers' own forward already"
    if (why := peer.unavailable()) is not None:
        return None, why
    reference = peer.PeerBackend(model)
    with torch.inference_mode():
        reference.prefill(prompt.to(model.lm_head.weight.device))
    return reference, None
