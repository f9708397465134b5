"""A step that launched nothing (no kernel launch, no graph launch) is idle: it ran neither
eagerly nor from a graph, so the ledger gives it a row of its own and the silent-fallback line
and `--fail-on-eager-decode` never count it as an eager step (graphrt.trace.analysis.markers.step_mode).

The trace is hand-written in torch.profiler's layout: vLLM's step annotations on one thread, the
runtime calls each step made inside it, and the kernels they launched."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from graphrt.cli.main import main

PREFILL, DECODE, NOTHING = "execute_context_1(10)_generation_0(0)", "execute_context_0(0)_generation_4(4)", \
    "execute_context_0(0)_generation_0(0)"


def _x(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1 if cat != "kernel" else 7, "ts": ts, "dur": dur,
            "args": args}


def _step(name: str, at: float, launches: list[str]) -> list[dict]:
    """A step at `at` µs whose thread made `launches` inside it, each running one kernel."""
    events = [_x("user_annotation", name, at, 90)]
    for i, call in enumerate(launches):
        correlation = int(at) + i
        events += [_x("cuda_runtime", call, at + 10 + i, 1, correlation=correlation),
                   _x("kernel", f"k{correlation}", at + 20 + i, 1, device=0, stream=7, correlation=correlation)]
    return events


def _analyze(tmp_path: Path, steps: list[tuple[str, list[str]]], *options: str) -> tuple[int, str, dict | None]:
    events = [e for i, (name, launches) in enumerate(steps) for e in _step(name, 100.0 * i, launches)]
    trace, out = tmp_path / "steps.json", tmp_path / "figures.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    result = CliRunner().invoke(main, ["analyze", str(trace), "--json", str(out), *options])
    return result.exit_code, result.output, json.loads(out.read_text()) if out.exists() else None


STEPS = [(PREFILL, ["cudaLaunchKernel", "cudaLaunchKernel"]), (DECODE, ["cudaGraphLaunch"]), (DECODE, []),
         (DECODE, ["cudaGraphLaunch"]), (NOTHING, [])]


def test_a_step_that_launched_nothing_is_idle_and_only_the_real_eager_prefill_is_eager(tmp_path):
    code, text, figures = _analyze(tmp_path, STEPS)
    assert code == 0
    (trace,) = figures["traces"]
    assert [s["mode"] for s in trace["steps"]] == ["eager", "graph", "idle", "graph", "idle"]
    assert [(r["phase"], r["mode"], r["batch"], r["steps"]) for r in trace["ledger"]] == [
        ("prefill", "eager", 1, 1), ("decode", "graph", 4, 2), ("decode", "idle", 4, 1), ("idle", "idle", 0, 1)]


def test_an_idle_decode_step_among_replays_is_no_silent_fallback(tmp_path):
    code, text, figures = _analyze(tmp_path, STEPS)
    assert "silent fallback" not in text and figures["traces"][0]["fallback"] is None
    # the same step with one kernel launch in it did fall back: the line is there for it
    steps = [*STEPS[:2], (DECODE, ["cudaLaunchKernel"]), *STEPS[3:]]
    assert "silent fallback: 1 decode step ran eagerly (batch 4: 1 step)" in _analyze(tmp_path, steps)[1]


def test_fail_on_eager_decode_passes_idle_steps_and_cannot_tell_from_idle_ones_alone(tmp_path):
    assert _analyze(tmp_path, STEPS, "--fail-on-eager-decode")[0] == 0
    code, text, _ = _analyze(tmp_path, [(DECODE, []), (DECODE, [])], "--fail-on-eager-decode")
    assert code == 1 and "no decode step whose mode can be told" in text
