"""`graphrt analyze` on a directory `graphrt trace --tp 2` wrote: per-rank figures and the slowest
rank per step, checked against figures this test works out from the raw Chrome JSON itself."""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
from pathlib import Path

import pytest
from conftest import TP2_STEPS, TP2_WARMUP

STEP_PREFIXES = ("decode_step[", "replay[")


def _union_us(spans: list[tuple[float, float]]) -> float:
    covered, end = 0.0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            covered, end = covered + e - s, e
        elif e > end:
            covered, end = covered + e - end, e
    return covered


def _raw_steps(trace: Path) -> dict[str, list[dict]]:
    """Per step range name, each step (in order) worked out from the raw events: its wall time,
    its top-level CPU ops, and its time in AllReduce module ranges and functional collectives."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    steps: dict[str, list[dict]] = {}
    for step in sorted((e for e in events if e["name"].startswith(STEP_PREFIXES)), key=lambda e: e["ts"]):
        lo, hi = step["ts"], step["ts"] + step["dur"]
        mine = [e for e in events if (e["pid"], e["tid"]) == (step["pid"], step["tid"])
                and lo <= e["ts"] and e["ts"] + e["dur"] <= hi and e is not step]
        ops = [e for e in mine if e["cat"] == "cpu_op"]
        top = [o for o in ops if not any(p is not o and p["ts"] <= o["ts"] and o["ts"] + o["dur"] <= p["ts"] + p["dur"]
                                         for p in ops)]
        collective = [(e["ts"], e["ts"] + e["dur"]) for e in mine
                      if (e["cat"] == "user_annotation" and e["name"].endswith(" (AllReduce)"))
                      or (e in top and e["name"].startswith("_c10d_functional::"))]
        steps.setdefault(step["name"], []).append(
            {"wall_us": step["dur"], "ops": len(top), "collective_us": _union_us(collective)})
    return steps


def _raw_ranks(directory: Path) -> list[dict[str, list[dict]]]:
    return [{name: steps for trace in sorted((directory / f"rank{r}").glob("*.json")) if trace.name != "summary.json"
             for name, steps in _raw_steps(trace).items()} for r in range(2)]


def test_every_ranks_figures_are_those_of_its_raw_trace(cli, tiny_tp2_traces, tmp_path):
    result = cli("analyze", tiny_tp2_traces, "--json", tmp_path / "ranks.json")
    assert result.exit_code == 0, result.output
    assert f"{tiny_tp2_traces}: 2 ranks" in result.stdout
    doc = json.loads((tmp_path / "ranks.json").read_text())
    raw = _raw_ranks(tiny_tp2_traces)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for figures, steps in zip(doc["ranks"], raw):
        groups = {g["name"]: g for g in figures["step_groups"]}
        assert set(groups) == set(steps) == {"decode_step[eager]", "replay[bs=1]"}
        for name, want in steps.items():
            got = groups[name]
            assert got["steps"] == len(want) == TP2_STEPS - TP2_WARMUP
            assert got["median_wall_ns"] / 1e3 == pytest.approx(statistics.median(s["wall_us"] for s in want), abs=0.01)
            assert got["work_unit"] == "ops"  # a CPU trace has no kernels
            assert got["work_per_step"] == statistics.median(s["ops"] for s in want)
            assert [c / 1e3 for c in got["collective_ns"]] == pytest.approx([s["collective_us"] for s in want], abs=0.01)
            # eager steps and replays alike spend time in their collectives (a replay fires no range)
            assert all(s["collective_us"] > 0 for s in want)
            assert got["collective_share"] == pytest.approx(
                statistics.median(s["collective_us"] / s["wall_us"] for s in want), rel=1e-4)
            assert got["collective_share_of"] == "CPU time in collectives over the step's CPU time"


def test_the_slowest_rank_of_each_step_is_named_with_its_lead(cli, tiny_tp2_traces, tmp_path):
    result = cli("analyze", tiny_tp2_traces, "--json", tmp_path / "ranks.json")
    assert result.exit_code == 0, result.output
    raw = _raw_ranks(tiny_tp2_traces)
    slowest = {s["step_group"]: s["steps"] for s in json.loads((tmp_path / "ranks.json").read_text())["slowest"]}
    for name in ("decode_step[eager]", "replay[bs=1]"):
        assert f"{name}: the slowest rank per step" in result.stdout
        for i, got in enumerate(slowest[name]):
            walls = [ranks[name][i]["wall_us"] for ranks in raw]
            assert got["rank"] == walls.index(max(walls))
            assert got["over_fastest_ns"] / 1e3 == pytest.approx(max(walls) - min(walls), abs=0.01)


def test_plot_draws_each_ranks_eager_step_above_its_replay(cli, tiny_tp2_traces, tmp_path):
    pytest.importorskip("matplotlib")
    result = cli("analyze", tiny_tp2_traces, "--plot", tmp_path / "ranks.png")
    assert result.exit_code == 0, result.output
    assert "decode_step[eager] above replay[bs=1]" in result.stdout
    assert (tmp_path / "ranks.png").read_bytes().startswith(b"\x89PNG")


def test_one_ranks_directory_analyses_as_any_trace(cli, tiny_tp2_traces):
    result = cli("analyze", tiny_tp2_traces / "rank1")
    assert result.exit_code == 0, result.output
    assert "Decode steps" in result.stdout and "2 ranks" not in result.stdout


def _only(tiny_tp2_traces: Path, tmp_path: Path, *ranks: str) -> Path:
    made = tmp_path / "tp"
    for rank in ranks:
        shutil.copytree(tiny_tp2_traces / rank, made / rank)
    return made


@pytest.mark.parametrize("case", ["a rank missing at the end", "a rank missing between", "a rank unreadable"])
def test_a_missing_or_unreadable_rank_gets_one_line(cli, tiny_tp2_traces, tmp_path, case):
    if case == "a rank missing at the end":  # rank 0's summary says two ranks ran
        made, message = _only(tiny_tp2_traces, tmp_path, "rank0"), "rank1/ missing of 2 ranks"
    elif case == "a rank missing between":
        made = _only(tiny_tp2_traces, tmp_path, "rank0")
        shutil.copytree(tiny_tp2_traces / "rank1", made / "rank2")
        message = "rank1/ missing of 3 ranks"
    else:
        made = _only(tiny_tp2_traces, tmp_path, "rank0", "rank1")
        (made / "rank1" / "graph.json").write_text('{"traceEvents": [{"ph": "X"')
        message = "rank1/graph.json: not a readable Chrome-trace JSON"
    result = cli("analyze", made, "--json", tmp_path / "out.json")
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line
    assert not (tmp_path / "out.json").exists()


NCCL_RANKS = [Path(__file__).parents[1] / "data" / "torch" / f"hta-nccl-rank{r}-sendrecv.json.gz" for r in (0, 1)]


def _nccl_dir(tmp_path: Path, order: tuple[int, int]) -> Path:
    """The two real NCCL ranks' traces (tests/data/torch/README.md) laid out as `graphrt trace --tp
    2` lays out its ranks, the file of rank `order[r]` as rank r."""
    made = tmp_path / "tp"
    for r, source in enumerate(order):
        (made / f"rank{r}").mkdir(parents=True)
        (made / f"rank{r}" / "trace.json").write_bytes(gzip.decompress(NCCL_RANKS[source].read_bytes()))
    return made


def _raw_gpu_steps(trace: Path) -> list[dict]:
    """Each ProfilerStep worked out from the raw events: wall time, kernels and launch calls (a
    launch whose call began inside the step, on any thread of its process), and its share in
    NCCL kernels: their union over the span of its kernels."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    kernels = {e["args"]["correlation"]: e for e in events if e.get("cat") == "kernel"}
    calls = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"].startswith("cudaLaunch")]
    steps = []
    for step in sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"]):
        mine = [c for c in calls if c["pid"] == step["pid"] and step["ts"] <= c["ts"] <= step["ts"] + step["dur"]]
        launched = [kernels[c["args"]["correlation"]] for c in mine]
        nccl = [(k["ts"], k["ts"] + k["dur"]) for k in launched if k["name"].startswith("ncclKernel_")]
        span = max(k["ts"] + k["dur"] for k in launched) - min(k["ts"] for k in launched)
        steps.append({"wall_us": step["dur"], "kernels": len(launched), "launches": len(mine),
                      "nccl": len(nccl), "share": _union_us(nccl) / span})
    return steps


@pytest.mark.parametrize("order, slowest", [((0, 1), 1), ((1, 0), 0)])
def test_on_real_nccl_ranks_every_column_and_the_slowest_rank_are_those_of_the_raw_traces(
        cli, tmp_path, order, slowest):
    made = _nccl_dir(tmp_path, order)
    result = cli("analyze", made, "--json", tmp_path / "ranks.json")
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "ranks.json").read_text())
    raw = [_raw_gpu_steps(made / f"rank{r}" / "trace.json") for r in (0, 1)]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("ProfilerStep#* ")]
    assert "collective %: GPU time in NCCL kernels over the step's GPU time" in result.stdout
    for r, (row, steps) in enumerate(zip(rows, raw)):
        assert all(s["nccl"] == 5 for s in steps)  # five NCCL send/recvs in every step
        (group,) = doc["ranks"][r]["step_groups"]
        share = statistics.median(s["share"] for s in steps)
        assert group["collective_share"] == pytest.approx(share, abs=1e-6)
        assert group["step_shares"] == pytest.approx([s["share"] for s in steps], abs=1e-6)
        assert group["collective_share_of"].startswith("GPU time in NCCL kernels")
        # steps, rank, count, step µs, work, launch calls, collective %: each as the raw trace says
        assert row == ["ProfilerStep#*", str(r), str(len(steps)),
                       f"{statistics.median(s['wall_us'] for s in steps):,.1f}",
                       f"{statistics.median(s['kernels'] for s in steps):,.0f}", "kernels",
                       f"{statistics.median(s['launches'] for s in steps):,.0f}", f"{share:.1%}"]
    (group,) = doc["slowest"]
    for i, got in enumerate(group["steps"]):
        walls = [steps[i]["wall_us"] for steps in raw]
        assert got["rank"] == walls.index(max(walls)) == slowest  # wherever the slowest rank sits
        assert got["over_fastest_ns"] / 1e3 == pytest.approx(max(walls) - min(walls), abs=0.01)
    assert f"the slowest rank per step (rank {slowest} in 2 of 2 steps)" in result.stdout
