"""The decode step captured once per batch bucket, then replayed: copy in, replay, read out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from graphrt.backends.base import Backend, PrepareReport
from graphrt.backends.choices import default_buckets
from graphrt.errors import GraphrtError
from graphrt.graphs import (CudaGraph, Graph, GraphCaptureError, GraphPool, LintReport, capture, graph_kind,
                            lint_step, new_pool, set_up_capture)
from graphrt.graphs.agree import check_ranks_agree
from graphrt.graphs.probe import Probe, ProbeSet
from graphrt.measure.nvtx import nvtx_range
from graphrt.model.decoder import Qwen2ForCausalLM

T = TypeVar("T")


def _bucket_memory(graphs: tuple[Graph, ...]) -> dict[str, int | None]:
    """What one bucket's graphs (one, or a piecewise step's several) took, summed."""
    memory = {"pool_bytes": sum(graph.memory_bytes for graph in graphs)}
    if all(isinstance(graph, CudaGraph) for graph in graphs):
        taken = [graph.device_bytes for graph in graphs]
        # None where one of them cannot say (graphrt.graphs.pool.device_bytes_taken)
        memory["device_bytes"] = None if None in taken else sum(taken)
    return memory


def lint_states(model: Qwen2ForCausalLM, batch: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """The two states `lint_decode` captures the step from, each (tokens [B, 1], positions [B]):
    the first at the middle of the cache, the second with other tokens one position on; and
    that middle position."""
    device, vocab, slots = model.lm_head.weight.device, model.config.vocab_size, model.max_seq_len
    # Any two in-range states that differ in every token and position would do: the values
    # below are arbitrary, and mutation testing leaves them alone.
    position = max(0, (slots - 2) // 2)
    tokens = torch.arange(batch, device=device).unsqueeze(1) % vocab  # [B, 1]
    positions = torch.full((batch,), position, device=device)
    states = [(tokens, positions), ((tokens + 1) % vocab, (positions + 1).clamp(max=slots - 1))]
    return states, position


def lint_decode(model: Qwen2ForCausalLM, batch: int) -> LintReport:
    """The decode step captured from two states, positions p and p+1 with other tokens, and
    compared (`graphrt.graphs.lint_step`). Runs through a tape on any device.

    What the captures write into the KV cache is left there (restore=False): the graph backend
    lints before any prefill, when the cache holds nothing yet, and its own captures write it too.
    No warmup: the step has no first-call path, so a cold capture is a steady one (and tests
    lint it cold over random configs).
    """
    states, position = lint_states(model, batch)
    model.seek(position)  # a cache that keeps its own write position writes where the states say
    with torch.inference_mode():
        # restore=True would only cost more: what the captures leave in the cache is not read
        return lint_step(model.decode_step, states, warmup=0, restore=False)


class LintRefusal(GraphCaptureError):
    """The lint found what a graph would replay wrongly: the findings, and their first in one line."""

    def __init__(self, report: LintReport):
        self.findings = report.findings
        lines = "\n".join(f"  {finding}" for finding in report.findings)
        super().__init__(f"the decode step would not replay like eager ({len(report.findings)} lint "
                         f"findings; --no-lint captures anyway):\n{lines}")

    def one_line(self) -> str:
        more = len(self.findings) - 1
        return f"{self.findings[0]}" + (f" (and {more} more lint finding{'s' * (more > 1)})" if more else "")


class GraphBackend(Backend):
    """CUDA Graph replay on CUDA; a TapeGraph with the same rules on other devices.

    Buckets are captured largest first into one memory pool; a batch pads up to the next
    bucket, and its pad rows write only into KV-cache rows no live sequence uses (rows B and up).
    A batch above the largest bucket is an error, not a silent fall-back to eager: a figure
    labelled "graph" is always a graph's. Before the first capture the step is linted
    (`lint_decode`); a finding is a GraphCaptureError, unless `lint` is off. With `annotate`, a
    CUDA capture also records the ranges open at each graph node's capture where the machine
    can (`CudaGraph.node_ranges`); off by default, as it adds to the capture time. With
    `probe`, every capture also copies the step's inputs, each module's inputs and output and
    the logits into probe buffers (graphrt.graphs.probe; `probe_values`): what localizing a difference
    from eager reads after each step.
    """

    name = "graph"

    def __init__(
        self,
        model: Qwen2ForCausalLM,
        buckets: tuple[int, ...] | None = None,
        lint: bool = True,
        annotate: bool = False,
        probe: bool = False,
    ):
        super().__init__(model)
        self.requested = buckets
        self.lint = lint
        self.annotate = annotate
        self.buckets: tuple[int, ...] = ()
        self.graphs: dict[int, tuple[Graph, torch.Tensor]] = {}
        self.probe = probe
        self.probes: dict[int, list[ProbeSet]] = {}  # per bucket, one per graph, in step order
        self.kind = graph_kind(model.lm_head.weight.device)

    def _buckets_for(self, max_batch: int) -> tuple[int, ...]:
        buckets = self._requested_buckets(max_batch)
        # a cache of one batch size (transformers' StaticCache) runs every step at its rows: the
        # largest bucket is the only one a replay would use
        return buckets[-1:] if self.model.fixed_batch else buckets

    def _requested_buckets(self, max_batch: int) -> tuple[int, ...]:
        if self.requested is None:
            return default_buckets(max_batch)
        if max_batch > self.requested[-1]:
            raise GraphrtError(
                f"batch {max_batch} exceeds the largest graph bucket {self.requested[-1]} "
                f"(--buckets {','.join(map(str, self.requested))}); add a bucket of at least {max_batch}")
        return self.requested

    def cache_rows(self, batch: int) -> int:
        return self._buckets_for(batch)[-1]  # the largest capture writes that many rows

    def bucket(self, batch: int) -> int:
        if not self.buckets:
            raise GraphrtError("the graph backend has captured nothing yet: call prepare(max_batch) first")
        for b in self.buckets:
            if b >= batch:
                return b
        raise GraphrtError(f"batch {batch} exceeds the largest captured bucket {self.buckets[-1]}")

    def prepare(self, max_batch: int) -> PrepareReport:
        self.buckets = self._buckets_for(max_batch)
        rows = self.buckets[-1]
        if rows > self.model.max_batch:
            raise GraphrtError(f"the KV cache holds {self.model.max_batch} rows, bucket {rows} needs more")
        device = self.model.lm_head.weight.device
        self._allocate_inputs(rows, device)
        if dist.is_initialized():
            # every rank must capture the same collectives. Checked first, before the lint, whose
            # captures issue the step's real collectives: ranks that disagree would wait in them
            # forever. Checking also lines the ranks up, with nothing of theirs in flight.
            with torch.inference_mode():
                check_ranks_agree(lambda: self.model.decode_step(self.tokens[:1], self.positions[:1]),
                                  self.model)
        lint_seconds = self._lint() if self.lint else None
        pool = new_pool(device)
        self.model.seek(0)  # the captures' warmups write the cache from slot 0 on; prefill starts it afresh
        start, capture_seconds = time.perf_counter(), {}
        # the process's one-off capture set-up, apart from every bucket's capture_seconds
        setup_seconds = set_up_capture(device) if self.kind == "cuda" else None
        with torch.inference_mode():
            for bs in sorted(self.buckets, reverse=True):  # largest first: smaller ones reuse its pool
                began = time.perf_counter()
                with nvtx_range(f"capture[bs={bs}]"):
                    self._capture_bucket(bs, pool)
                capture_seconds[bs] = time.perf_counter() - began
        seconds = time.perf_counter() - start
        graphs = {bs: self._bucket_graphs(bs) for bs in self.graphs}
        memory = sum(graph.memory_bytes for bucket in graphs.values() for graph in bucket)
        per_bucket = {bs: _bucket_memory(bucket) for bs, bucket in graphs.items()}
        notes = [] if self.kind == "cuda" else [  # pragma: no mutate (CUDA only)
            "TapeGraphs here: CUDA-graph semantics without a GPU, a correctness "
            "check, not a speed claim (launch overhead exists only on CUDA)"]
        return PrepareReport(seconds, memory, notes, per_bucket, lint_seconds, capture_seconds, setup_seconds)

    def _lint(self) -> float:
        """Lint the step at the smallest bucket (the cheapest: a Python value a graph would
        freeze is there at any batch); its cost in seconds."""
        report = lint_decode(self.model, self.buckets[0])
        if not report.clean:
            raise LintRefusal(report)
        return report.seconds

    def _allocate_inputs(self, rows: int, device: torch.device) -> None:
        """The static inputs every replay reads, so each step copies its inputs in."""
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)

    def _capture_bucket(self, bs: int, pool: GraphPool) -> None:
        step = self._probed(bs, lambda: self.model.decode_step(self.tokens[:bs], self.positions[:bs]),
                            first=True, last=True)
        self.graphs[bs] = capture(step, device=pool.device, pool=pool, annotate=self.annotate)

    def _probed(self, bs: int, fn: Callable[[], T], first: bool, last: bool) -> Callable[[], T]:
        """`fn`, one graph of bucket `bs`, with probes when probing (else `fn` itself): the
        step's inputs if it is the `first` graph of the step, the logits if the `last`."""
        if not self.probe:
            return fn
        inputs = {"tokens": self.tokens[:bs], "positions": self.positions[:bs]} if first else {}
        probes = ProbeSet(self.model, inputs, output=last)
        self.probes.setdefault(bs, []).append(probes)
        return probes.wrap(fn)

    def probe_values(self, bs: int) -> list[Probe]:
        """Bucket `bs`'s probes as its last step left them, in step order."""
        return [probe for probes in self.probes[bs] for probe in probes.values()]

    def _bucket_graphs(self, bs: int) -> tuple[Graph, ...]:
        """The graphs bucket `bs` captured."""
        return (self.graphs[bs][0],)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        batch = tokens.shape[0]
        bs = self.bucket(batch)
        with nvtx_range("copy_in"):
            self.tokens[:batch].copy_(tokens)
            self.positions[:batch].copy_(positions)
        return self._run_bucket(bs)[:batch]

    def _run_bucket(self, bs: int) -> torch.Tensor:
        """Run bucket `bs` on the static inputs; its static logits [bs, V]."""
        graph, logits = self.graphs[bs]
        with nvtx_range(f"replay[bs={bs}]"):
            graph.replay()
        return logits
