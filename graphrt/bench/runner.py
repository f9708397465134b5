"""The sweep: every point of a scenario, every mode at each, into one results document.

The model is built once per name and reused across that model's points; each point sizes the
cache afresh (`setup_cache`), makes fresh backends (a graph captures the new cache's tensors; a
compile starts from a Dynamo reset, so shapes never turn dynamic and the recompile limit, past
which Dynamo silently runs eager, is never reached) and measures the modes interleaved, repeat
by repeat, so a slow spell of a shared machine spreads over all modes instead of landing on one.

No per-module NVTX hooks are attached: bench times the step as a user runs it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from datetime import datetime, timezone
from itertools import groupby
from typing import Any

import torch

from graphrt import hardware
from graphrt.backends import Backend
from graphrt.backends.factory import make_backend
from graphrt.backends.graph import GraphBackend
from graphrt.bench import peer, results
from graphrt.bench.roofline import Ceilings, ceilings, step_cost
from graphrt.bench.scenario import Point, Scenario
from graphrt.config import resolve
from graphrt.engine import Generation, count_launches, decode, random_prompt
from graphrt.errors import GraphrtError
from graphrt.model import Qwen2ForCausalLM
from graphrt.runner import RunSpec, load, resolve_device, resolve_dtype


def _cuda_memory() -> dict[str, int]:
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Sweep:
    """A scenario resolved for this machine: its points, its modes (the peer among them where
    it can run), and how many measurements that makes, before anything is built."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.device = resolve_device(scenario.device)
        self.dtype = resolve_dtype(scenario.dtype, self.device)
        self.points = scenario.points()
        for name in scenario.models:  # fail before the first point, not in the middle
            config, _ = resolve(name)
            longest = max((scenario.max_seq_len(p) for p in self.points if p.model == name), default=0)
            if longest > config.max_position_embeddings:
                raise GraphrtError(
                    f"{scenario.source or scenario.name}: context {longest - scenario.decode_steps} "
                    f"+ {scenario.decode_steps} decode steps exceeds {config.name}'s "
                    f"max_position_embeddings {config.max_position_embeddings}")
        self.peer_note = peer.unavailable() if scenario.peer else "peer = false in the scenario"
        self.modes = (*scenario.modes, *([peer.NAME] if self.peer_note is None else []))

    @property
    def total(self) -> int:
        """Decodes the sweep runs: points x repeats x modes."""
        return len(self.points) * self.scenario.repeats * len(self.modes)

    def run(self, on_measure: Callable[[str], None] | None = None,
            on_point: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Measure every point; returns the results document.

        `on_measure(label)` is called before each decode, `on_point(document)` after each point
        with the points so far. A KeyboardInterrupt stops the sweep: the document then holds
        the finished points, `partial` stays true and `stopped_at` says where it stopped.
        """
        threads = torch.get_num_threads()
        if self.scenario.threads:
            torch.set_num_threads(self.scenario.threads)
        try:
            return self._run(on_measure, on_point)
        finally:
            torch.set_num_threads(threads)

    def _run(self, on_measure: Callable[[str], None] | None,
             on_point: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
        measured = hardware.measure(self.device, self.dtype)
        limits = ceilings(self.dtype, measured)
        doc = results.new_document(self.scenario, self.device, self.dtype, measured,
                                   self.modes, self.peer_note)
        self._where: dict[str, Any] = {}  # what is running now, for an interrupt to report
        try:
            for name, group in groupby(enumerate(self.points, 1), key=lambda item: item[1].model):
                self._where = {"point": None, "label": f"loading {name}", "mode": None}
                spec = RunSpec(model=name, device=self.scenario.device, dtype=self.scenario.dtype,
                               seed=self.scenario.seed)
                _, model, _, _ = load(spec)
                after_load = _cuda_memory() if self.device.type == "cuda" else None
                for number, point in group:
                    self._where = {"point": number, "label": point.label, "mode": None}
                    doc["points"].append(self._measure(point, model, limits, after_load, on_measure))
                    if on_point:
                        on_point(doc)
                del model  # before the next model is built
        except KeyboardInterrupt:
            doc["stopped_at"] = {**self._where, "of": len(self.points)}
            return doc
        doc["partial"] = False
        doc["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return doc

    def _measure(self, point: Point, model: Qwen2ForCausalLM, limits: Ceilings,
                 after_load: dict[str, int] | None, on_measure: Callable[[str], None] | None
                 ) -> dict[str, Any]:
        s, cuda = self.scenario, self.device.type == "cuda"
        gc.collect()  # the last point's graphs and caches, before this point's memory is read
        if cuda:
            torch.cuda.empty_cache()
        if "compile" in s.modes:
            torch._dynamo.reset()
        backends: list[Backend] = [make_backend(m, model) for m in s.modes]
        if peer.NAME in self.modes:  # made per point like the others: its cache goes with them
            backends.append(peer.PeerBackend(model))
        seq_len = s.max_seq_len(point)
        model.setup_cache(max(b.cache_rows(point.batch) for b in backends), seq_len)
        memory = self._memory(model, after_load)

        prepared, peaks = {}, dict.fromkeys((b.name for b in backends), 0)
        for b in backends:
            self._where["mode"] = b.name
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            prepared[b.name] = b.prepare(point.batch)
            if cuda:
                peaks[b.name] = torch.cuda.max_memory_allocated()

        prompt = random_prompt(point.batch, s.prompt_len, model.config.vocab_size, s.seed)
        runs: dict[str, list[Generation]] = {b.name: [] for b in backends}
        for r in range(s.repeats):
            for b in backends:
                self._where["mode"] = b.name
                if on_measure:
                    on_measure(f"{point.label}: {b.name} ({r + 1}/{s.repeats})")
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                runs[b.name].append(decode(b, prompt, s.decode_steps, s.warmup,
                                           keep_logits=False, start=point.context))
                if cuda:
                    peaks[b.name] = max(peaks[b.name], torch.cuda.max_memory_allocated())
        # after the timing: the profiler that counts on CUDA taxes launches
        counted = count_launches([(b, runs[b.name][0]) for b in backends], point.context)
        for b in backends:
            runs[b.name][0].launches = counted[b.name]

        modes = {}
        for b in backends:
            rows = b.bucket(point.batch) if isinstance(b, GraphBackend) else point.batch
            modes[b.name] = results.mode_record(
                runs[b.name], prepared[b.name], step_cost(model.config, rows, seq_len, self.dtype.itemsize),
                limits, point.batch, s.max_spread, peaks[b.name] if cuda else None)
        return results.point_record(point, s, seq_len, memory, modes, runs,
                                    tokens_comparable=point.context == s.prompt_len)

    def _memory(self, model: Qwen2ForCausalLM, after_load: dict[str, int] | None) -> dict[str, Any]:
        caches = [layer.self_attn.cache for layer in model.model.layers]
        memory: dict[str, Any] = {
            "parameter_bytes": _tensor_bytes(model.parameters()),
            "cache_bytes": _tensor_bytes([t for c in caches for t in (c.k, c.v)]),
        }
        if after_load is None:
            memory["note"] = "CPU allocator peaks are not measured"
        else:
            memory["after_load"] = after_load
            memory["after_cache"] = _cuda_memory()
        return memory
