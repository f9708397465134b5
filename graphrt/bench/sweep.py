"""The sweep: every point of a scenario, every mode at each, into one results document.

The model is built once per name and reused across that model's points; each point sizes the
cache afresh (`setup_cache`), makes fresh backends (a graph captures the new cache's tensors; a
compile starts from a Dynamo reset, so shapes never turn dynamic and the recompile limit, past
which Dynamo silently runs eager, is never reached) and measures the modes interleaved, repeat
by repeat, so a slow spell of a shared machine spreads over all modes instead of landing on one.

Every point is timed before any is counted. Counting a step's launches opens a profiler session
on CUDA, and CUPTI stays attached after it, taxing every later eager launch far more than a
graph's one (docs/design.md, "torch.profiler and CUPTI"): so once the last point is timed, each
point's backends are made and prepared again and one step of each mode is counted, all in the
same process, with no timing after. A sweep stopped before then keeps its timed points, their
launches unknown (null).

Points with tp > 1 run on tp ranks started through torch.distributed's launcher, as
`graphrt run --tp` starts them, once for all the points of one model and tp: each rank loads its
share and measures the points as above (without the peer: Hugging Face's step needs the whole
model), every step time is the slowest rank's (a step waits for the last rank at each
all-reduce), and the roofline is one rank's share of the work. Rank 0's records come back.

No per-module NVTX hooks are attached: bench times the step as a user runs it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from datetime import datetime, timezone
from itertools import groupby
from typing import Any

import torch

from graphrt.backends import peer
from graphrt.backends.base import Backend
from graphrt.backends.factory import make_backend
from graphrt.backends.graph import GraphBackend
from graphrt.bench import results
from graphrt.bench.scenario import Point, Scenario
from graphrt.errors import GraphrtError
from graphrt.measure import hardware
from graphrt.measure.roofline import Ceilings, ceilings, step_cost
from graphrt.model.config import FAMILIES
from graphrt.model.decoder import Qwen2ForCausalLM
from graphrt.model.resolve import resolve
from graphrt.model.sharding import rank_shapes, split
from graphrt.parallel import launch, ranks as ranks_
from graphrt.parallel.ranks import Ranks
from graphrt.run.decode import Generation, count_launches, decode, random_prompt
from graphrt.run.machine import resolve_device, resolve_dtype
from graphrt.run.execute import load
from graphrt.run.rank_figures import slowest_per_step
from graphrt.run.spec import RunSpec


def _cuda_memory() -> dict[str, int]:
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def release_memory(device: torch.device, compiled: bool) -> None:
    """Give back what the last point held, before the next point's memory is read: Dynamo's
    compiled steps first (a reduce-overhead step's CUDA graph trees keep their memory pool
    reserved), then the garbage they and the last point's graphs and caches leave, then, on
    CUDA, the allocator's cached blocks, which by then include all of those."""
    if compiled:
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Sweep:
    """A scenario resolved for this machine: its points, its modes (the peer among them where
    it can run), and how many measurements that makes, before anything is built."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.device = resolve_device(scenario.device)
        self.dtype = resolve_dtype(scenario.dtype, self.device)
        self.points = scenario.points()
        where = scenario.source or scenario.name
        if self.device.type == "cuda" and max(scenario.tp) > torch.cuda.device_count():
            raise GraphrtError(f"{where}: tp {max(scenario.tp)}: one GPU per rank, and this machine "
                               f"has {torch.cuda.device_count()}")
        self.transformers_models: set[str] = set()  # run on transformers' forward: no peer, no roofline
        for name in scenario.models:  # fail before the first point, not in the middle
            config, _ = resolve(name)
            if not config.lean:
                self.transformers_models.add(name)
            for tp in scenario.tp:
                launch.refuse_transformers(config, tp)
                try:
                    split(config, 0, tp)
                except GraphrtError as e:
                    raise GraphrtError(f"{where}: tp {tp}: {e}") from None
            longest = max((scenario.max_seq_len(p) for p in self.points if p.model == name), default=0)
            if longest > config.max_position_embeddings:
                raise GraphrtError(
                    f"{where}: context {longest - scenario.decode_steps} "
                    f"+ {scenario.decode_steps} decode steps exceeds {config.name}'s "
                    f"max_position_embeddings {config.max_position_embeddings}")
        self.peer_note = peer.unavailable() if scenario.peer else "peer = false in the scenario"
        self.modes = (*scenario.modes, *([peer.NAME] if self.peer_note is None else []))
        self._where: dict[str, Any] = {}  # what is running now, for an interrupt to report

    @property
    def total(self) -> int:
        """Parts the sweep runs: points x repeats x modes decodes (no peer where tp > 1), and a
        count of each point's launches."""
        return sum(len(self._modes(p)) * self.scenario.repeats + 1 for p in self.points)

    def _modes(self, point: Point) -> tuple[str, ...]:
        """The peer is transformers' eager step beside graphrt's: none where the model runs on
        transformers' forward already, or under tp."""
        return self.scenario.modes if point.tp > 1 or point.model in self.transformers_models else self.modes

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
        uncounted: list[tuple[int, Point, dict[str, Any], dict[str, Generation]]] = []
        held: dict[str, Qwen2ForCausalLM] = {}  # the model loaded last, by name
        try:
            for (name, tp), group in groupby(enumerate(self.points, 1), key=lambda item: (item[1].model, item[1].tp)):
                if tp > 1:
                    self._on_ranks(list(group), limits, doc, on_measure, on_point)
                    continue
                held.clear()  # before the next model is built
                model, after_load = self._load(name)
                held[name] = model
                for number, point in group:
                    self._where = {"point": number, "label": point.label, "mode": None}
                    record, runs = self._measure(point, model, limits, after_load, on_measure)
                    doc["points"].append(record)
                    uncounted.append((number, point, record, runs))
                    if on_point:
                        on_point(doc)
                del model
            # every point is timed: only now may a profiler session open (see the module)
            for name, group in groupby(uncounted, key=lambda item: item[1].model):
                if name not in held:
                    held.clear()
                    held[name] = self._load(name)[0]
                model = held[name]
                for number, point, record, runs in group:
                    self._where = {"point": number, "label": f"{point.label}: counting launches", "mode": None}
                    if on_measure:
                        on_measure(self._where["label"])
                    results.add_launches(record, self._count(point, model, runs))
                    if on_point:
                        on_point(doc)
                del model
            held.clear()
        except KeyboardInterrupt:
            doc["stopped_at"] = {**self._where, "of": len(self.points)}
            return doc
        doc["partial"] = False
        doc["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return doc

    def _load(self, name: str) -> tuple[Qwen2ForCausalLM, dict[str, int] | None]:
        """The model `name`, and the CUDA allocator's figures once it is loaded."""
        self._where = {"point": None, "label": f"loading {name}", "mode": None}
        spec = RunSpec(model=name, device=self.scenario.device, dtype=self.scenario.dtype, seed=self.scenario.seed)
        _, model, _, _ = load(spec)
        return model, _cuda_memory() if self.device.type == "cuda" else None

    def _on_ranks(self, numbered: list[tuple[int, Point]], limits: Ceilings, doc: dict[str, Any],
                  on_measure: Callable[[str], None] | None,
                  on_point: Callable[[dict[str, Any]], None] | None) -> None:
        """The points of one model and one tp > 1, on tp ranks started once for all of them."""
        points = [p for _, p in numbered]
        first = points[0]
        self._where = {"point": numbered[0][0], "label": f"{first.model} tp {first.tp}: {len(points)} "
                       f"points on {first.tp} ranks", "mode": None}
        records = launch.launch(_measure_on_rank, [self.scenario, points, limits], first.tp)[0]
        for point, record in zip(points, records):
            # the ranks' progress is not seen from here: their decodes and count are heard once done
            for label in [*(f"{point.label}: {m} ({r + 1}/{self.scenario.repeats})"
                            for r in range(self.scenario.repeats) for m in self._modes(point)),
                          f"{point.label}: counting launches"]:
                if on_measure:
                    on_measure(label)
            doc["points"].append(record)
            if on_point:
                on_point(doc)

    def _backends(self, point: Point, model: Qwen2ForCausalLM, lint: bool = True) -> list[Backend]:
        """A point's backends, fresh, on a cache sized afresh for them."""
        release_memory(self.device, compiled="compile" in self.scenario.modes)
        backends: list[Backend] = [make_backend(m, model, lint=lint) for m in self.scenario.modes]
        if peer.NAME in self._modes(point):  # made per point like the others: its cache goes with them
            backends.append(peer.PeerBackend(model))
        model.setup_cache(max(b.cache_rows(point.batch) for b in backends), self.scenario.max_seq_len(point))
        return backends

    def _count(self, point: Point, model: Qwen2ForCausalLM, runs: dict[str, Generation]) -> dict[str, Any]:
        """What one step of each mode launches at `point`, on backends made and prepared again
        (their step is the one timed: its work depends on shapes only), counted after every
        point was timed. The lint ran when the point was timed.

        HF's step reads a StaticCache of its own that only its prefill makes: the peer is
        prefilled with the point's prompt first, as when it was timed."""
        backends = self._backends(point, model, lint=False)
        for b in backends:
            b.prepare(point.batch)
            if b.name == peer.NAME:
                with torch.inference_mode():
                    b.prefill(self._prompt(point, model).to(model.lm_head.weight.device))
        return count_launches([(b, runs[b.name]) for b in backends], point.context)

    def _prompt(self, point: Point, model: Qwen2ForCausalLM) -> torch.Tensor:
        """The prompt every mode at `point` decodes from (token ids [B, prompt_len], CPU)."""
        return random_prompt(point.batch, self.scenario.prompt_len, model.config.vocab_size, self.scenario.seed)

    def _measure(self, point: Point, model: Qwen2ForCausalLM, limits: Ceilings,
                 after_load: dict[str, int] | None, on_measure: Callable[[str], None] | None,
                 ranks: Ranks | None = None) -> tuple[dict[str, Any], dict[str, Generation]]:
        """A point timed: its record (launches not yet counted) and each mode's first decode,
        whose first step `_count` counts later."""
        s, cuda = self.scenario, self.device.type == "cuda"
        backends = self._backends(point, model)
        seq_len = s.max_seq_len(point)
        memory = self._memory(model, after_load)

        prepared, peaks = {}, dict.fromkeys((b.name for b in backends), 0)
        for b in backends:
            self._where["mode"] = b.name
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            prepared[b.name] = b.prepare(point.batch)
            if cuda:
                peaks[b.name] = torch.cuda.max_memory_allocated()

        prompt = self._prompt(point, model)
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
        if ranks is not None:  # in the same order on every rank: each gathers every rank's steps
            for gen in (gen for b in backends for gen in runs[b.name]):
                gen.step_ms, gen.host_ms = slowest_per_step(gen.step_ms), slowest_per_step(gen.host_ms)
        shapes = model.config if ranks is None else rank_shapes(model.config, split(model.config, ranks.rank, ranks.world))
        modes = {}
        for b in backends:
            rows = b.bucket(point.batch) if isinstance(b, GraphBackend) else point.batch
            cost = step_cost(shapes, rows, seq_len, self.dtype.itemsize) if shapes.model_type in FAMILIES else None
            modes[b.name] = results.mode_record(
                runs[b.name], prepared[b.name], cost,
                limits, point.batch, s.max_spread, peaks[b.name] if cuda else None)
        return (results.point_record(point, s, seq_len, memory, modes, runs,
                                     tokens_comparable=point.context == s.prompt_len),
                {b.name: runs[b.name][0] for b in backends})

    def _memory(self, model: Qwen2ForCausalLM, after_load: dict[str, int] | None) -> dict[str, Any]:
        memory: dict[str, Any] = {
            "parameter_bytes": _tensor_bytes(model.parameters()),
            "cache_bytes": _tensor_bytes(model.kv_cache_tensors()),
        }
        if after_load is None:
            memory["note"] = "CPU allocator peaks are not measured"
        else:
            memory["after_load"] = after_load
            memory["after_cache"] = _cuda_memory()
        return memory


def _measure_on_rank(scenario: Scenario, points: list[Point], limits: Ceilings) -> list[dict[str, Any]] | None:
    """One rank of the points of one model and one tp (a process the launcher started): rank 0's
    point records, None on the other ranks."""
    sweep = Sweep(scenario)
    if scenario.threads:
        torch.set_num_threads(scenario.threads)
    me = ranks_.join(sweep.device.type)
    spec = RunSpec(model=points[0].model, device=scenario.device, dtype=scenario.dtype, seed=scenario.seed,
                   tp=me.world)
    _, model, _, _ = load(spec, me)
    after_load = _cuda_memory() if sweep.device.type == "cuda" else None
    timed = [sweep._measure(point, model, limits, after_load, None, me) for point in points]
    for point, (record, runs) in zip(points, timed):  # counted once every point is timed
        results.add_launches(record, sweep._count(point, model, runs))
    records = [record for record, _ in timed]
    del model  # its graphs went with each point's backends; the group goes after them
    ranks_.leave()
    return records if me.leader else None
