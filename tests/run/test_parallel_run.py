"""`graphrt run --tp 2`: two ranks started through torch.distributed's launcher, one table from
rank 0, every rank's figures in the JSON; a rank that dies stops every rank, in bounded time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ranks
import torch
from conftest import save_reference
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from graphrt.model.config import PRESETS
from graphrt.parallel.launch import TORCHRUN_LOCAL, _cause, launch
from graphrt.run.execute import run
from graphrt.run.spec import RunSpec

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 90  # no run here takes half of it; a hang would take the collectives' 60 s timeout and more


def graphrt(*args: str, launcher: tuple[str, ...] = (), gpus: str = "", first_on_path: str = "") -> subprocess.Popen:
    """`python [launcher] -m graphrt ARGS`, seeing the GPUs `gpus` (none by default);
    `first_on_path`, a folder put before everything on PYTHONPATH."""
    # this checkout first, then whatever the caller's path holds (the device check's wheels)
    path = os.pathsep.join(filter(None, [first_on_path, str(ROOT), os.environ.get("PYTHONPATH")]))
    # a rank that aborts (SIGABRT, SIGSEGV) prints its Python stack: a failing test shows where
    env = {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen([sys.executable, *launcher, "-m", "graphrt", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# A machine whose host name resolves to nothing (no DNS, no /etc/hosts line for it), in every
# process: what the launcher, its agent and each rank see through Python's socket module.
NO_DNS = """
import socket

def _unresolvable(*args, **kwargs):
    raise socket.gaierror(socket.EAI_NONAME, "no such host: this machine has no DNS")

_getaddrinfo = socket.getaddrinfo

def _getaddrinfo_but_our_name(host, *args, **kwargs):
    if host == socket.gethostname():
        _unresolvable()
    return _getaddrinfo(host, *args, **kwargs)

socket.gethostname = lambda: "graphrt-test-host-without-dns"
socket.getfqdn = lambda name="": name or socket.gethostname()  # as it answers when no lookup does
socket.gethostbyname = _unresolvable
socket.getaddrinfo = _getaddrinfo_but_our_name
"""


@pytest.mark.processes
def test_two_tp_runs_at_once_on_a_machine_without_dns_both_finish(tmp_path):
    # each rendezvous binds 127.0.0.1 on a port of its own, and no rank looks its host name up
    (tmp_path / "sitecustomize.py").write_text(NO_DNS)
    runs = [graphrt("run", "--model", "tiny", "--tp", "2", "--mode", "eager", "--steps", "3",
                    first_on_path=str(tmp_path)) for _ in range(2)]
    for proc in runs:
        stdout, stderr = proc.communicate(timeout=BOUND_S)
        assert proc.returncode == 0, stdout + stderr  # stdout: whether rank 0 got to its table
        assert "eager: ranks' tokens identical" in stdout


@pytest.mark.processes
def test_a_rank_that_left_the_group_runs_none_of_its_threads_though_the_profiler_ran_in_between():
    # the profiler imports torch._dynamo, which imports torch.distributed.nn.functional; a thread
    # of the group's left running would run on through the rank's exit as its peers close sockets
    assert launch(ranks.threads_started_and_left, [], 2) == {0: [], 1: []}


@pytest.mark.processes
def test_tp_2_prints_one_ranks_table_and_its_json_holds_every_ranks_figures(tmp_path):
    out = tmp_path / "run.json"
    proc = graphrt("run", "--model", "tiny", "--tp", "2", "--mode", "eager,graph", "--steps", "6",
                   "--batch", "2", "--json", str(out))
    stdout, stderr = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 0, stderr
    assert stdout.count("2 ranks, each figure the slowest rank's") == 1  # rank 0 alone speaks
    assert "eager: ranks' tokens identical" in stdout
    assert "collective %: CPU time in collectives over the step's CPU time" in stdout
    doc = json.loads(out.read_text())
    _check_ranks_table(stdout, doc)
    assert doc["tp"] == 2
    # a rank moves its share of the weights: no bandwidth from the whole model's bytes
    assert doc["modes"]["eager"]["achieved_bandwidth"] is None
    single = run(RunSpec(model="tiny", mode="eager", steps=6, batch=2))
    for mode in ("eager", "graph"):
        figures = doc["ranks"][mode]
        assert [f["rank"] for f in figures] == [0, 1]
        for f in figures:
            assert len(f["samples_ms"]) == 6 - doc["warmup"] and f["ops_per_step"] > 0
            assert 0 < f["collective_share"] < 1
            assert f["collective_share_of"] == "CPU time in collectives over the step's CPU time"
            assert f["generated_ids"] == single.generations["eager"].tokens.tolist()


def _check_ranks_table(stdout: str, doc: dict) -> None:
    """Every column of the per-rank table against the figures the JSON holds: the slowest rank's
    time at each step (median, p10, p90), the ranks' medians apart, each rank's share and ops."""
    from graphrt.measure.stats import Stats

    rows = {line.split()[0]: line.split()[1:] for line in stdout.splitlines()
            if line.split()[:1] in (["eager"], ["graph"]) and " / " in line}
    assert set(rows) == set(doc["ranks"])
    for mode, figures in doc["ranks"].items():
        slowest = Stats.of([max(steps) for steps in zip(*(f["samples_ms"] for f in figures))])
        medians = [Stats.of(f["samples_ms"]).median for f in figures]
        want = [f"{slowest.median:.3f}", f"{slowest.p10:.3f}", f"{slowest.p90:.3f}",
                f"{max(medians) - min(medians):.3f}",
                *" / ".join(f"{100 * f['collective_share']:.1f}" for f in figures).split(),
                *" / ".join(str(f["ops_per_step"]) for f in figures).split()]
        assert rows[mode] == want


def _rank_process(launcher: int, rank: int) -> int | None:
    """The pid of the launcher's worker whose RANK is `rank`, once it exists."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    for pid in children:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    return None


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.processes
def test_a_rank_that_dies_stops_every_rank_with_one_line_and_no_hang():
    proc = graphrt("run", "--model", "tiny", "--tp", "2", "--mode", "eager", "--steps", "4000")
    start = time.monotonic()
    while None in (workers := [_rank_process(proc.pid, r) for r in (0, 1)]):
        assert time.monotonic() - start < BOUND_S and proc.poll() is None
        time.sleep(0.2)
    time.sleep(3)  # let them join the group and start decoding
    os.kill(workers[1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=BOUND_S)
    assert time.monotonic() - start < BOUND_S  # no hang
    assert not any(map(_alive, workers))  # every rank stopped
    assert proc.returncode == 1
    # one line, naming the rank that died and how, whichever rank's failure the agent saw first:
    # rank 0's own ("connection closed by peer") goes to the launcher, not to the terminal
    assert [line for line in stderr.splitlines() if line.startswith("error:")] == [
        f"error: rank 1 of 2 failed (exit code {-signal.SIGKILL}); every rank was stopped"]
    assert "Traceback" not in stderr


def test_the_cause_is_a_rank_killed_before_it_said_anything_not_a_peer_that_said_its_error_and_aborted(tmp_path):
    said = tmp_path / "error.json"  # what a rank hands the launcher (ranks.hand_error_to_launcher)
    said.write_text(json.dumps({"message": "RuntimeError: Connection closed by peer", "timestamp": 0}))
    silent = str(tmp_path / "none.json")
    # gloo aborts a rank whose pair broke on its way out, after it said so
    aborted_after_saying = ProcessFailure(local_rank=0, pid=1, exitcode=-signal.SIGABRT, error_file=str(said))
    assert _cause({0: aborted_after_saying, 1: ProcessFailure(1, 2, -signal.SIGKILL, silent)})[0] == 1
    assert _cause({0: aborted_after_saying, 1: ProcessFailure(1, 2, -signal.SIGTERM, silent)})[0] == 0
    assert _cause({0: ProcessFailure(0, 1, 1, str(said)), 1: ProcessFailure(1, 2, -signal.SIGSEGV, silent)})[0] == 1


@pytest.mark.processes
def test_a_failure_every_rank_meets_is_one_line_from_the_launcher_not_one_per_rank(tmp_path):
    # each rank loads the weights itself: a checkpoint without them fails on every rank alike
    save_reference(PRESETS["tiny"], tmp_path)
    for shard in tmp_path.glob("*.safetensors"):
        shard.unlink()
    proc = graphrt("run", "--model", str(tmp_path), "--tp", "2", "--mode", "eager", "--steps", "4")
    _, stderr = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 1
    said = re.escape(f"{tmp_path}: no model.safetensors or model.safetensors.index.json in this directory")
    assert re.fullmatch(rf"error: rank [01] of 2: {said} \(every rank was stopped\)", stderr.strip()), stderr


@pytest.mark.processes
def test_a_prompt_without_a_tokenizer_is_refused_in_one_line_before_any_rank_starts():
    proc = graphrt("run", "--model", "tiny", "--tp", "2", "--prompt", "hello")
    _, stderr = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 1
    assert stderr.strip() == ("error: --prompt needs a model directory with a tokenizer.json; preset 'tiny' "
                              "has random weights and no tokenizer (use --prompt-len for random ids)")


def test_a_tp_that_does_not_divide_the_heads_is_refused_in_one_line_before_any_rank_starts(cli):
    result = cli("run", "--model", "tiny", "--tp", "3")
    assert result.exit_code == 1
    assert result.stderr.strip() == ("error: --tp 3 does not divide tiny's heads and features: not its 4 "
                                     "query heads, nor its 2 KV heads (nor do they divide --tp), nor "
                                     "its 128 intermediate features")


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torchrun_with_one_nccl_rank_captures_its_all_reduces_and_leaves_cleanly(tmp_path):
    out = tmp_path / "run.json"
    proc = graphrt("run", "--model", "tiny", "--device", "cuda", "--tp", "1", "--mode", "eager,graph",
                   "--steps", "6", "--json", str(out),
                   launcher=("-m", "torch.distributed.run", "--nproc-per-node", "1", *TORCHRUN_LOCAL),
                   gpus=os.environ.get("CUDA_VISIBLE_DEVICES", "0"))  # pragma: no mutate
    stdout, stderr = proc.communicate(timeout=BOUND_S)  # NCCL would hang in teardown with live graphs
    assert proc.returncode == 0, stderr
    assert "graph vs eager: tokens identical" in stdout
    doc = json.loads(out.read_text())
    # one rank's in-place all-reduce is a no-op inside NCCL (nothing to send, nothing launched),
    # so its share is measured and zero: the capture and teardown are what this run checks
    assert doc["tp"] == 1 and doc["ranks"]["graph"][0]["collective_share"] == 0


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_on_two_gpus_run_and_analyze_give_each_rank_the_same_nccl_share_eager_and_replayed(tmp_path, cli):
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "0,1")  # pragma: no mutate
    out, traces = tmp_path / "run.json", tmp_path / "traces"
    for args in (("run", "--mode", "eager,graph", "--json", str(out)), ("trace", "--profiler", "torch", "--out",
                                                                         str(traces))):
        proc = graphrt(*args, "--model", "tiny", "--device", "cuda", "--tp", "2", "--steps", "12", gpus=gpus)
        _, stderr = proc.communicate(timeout=3 * BOUND_S)  # one after the other: they share the GPUs
        assert proc.returncode == 0, stderr
    (made,) = traces.iterdir()
    assert cli("analyze", made, "--json", tmp_path / "ranks.json").exit_code == 0
    analysed = json.loads((tmp_path / "ranks.json").read_text())["ranks"]
    ran = json.loads(out.read_text())["ranks"]
    for mode, group in (("eager", "decode_step[eager]"), ("graph", "replay[bs=1]")):
        for r in (0, 1):
            mine = {g["name"]: g for g in analysed[r]["step_groups"]}[group]
            assert ran[mode][r]["collective_share_of"] == mine["collective_share_of"]
            assert mine["collective_share_of"].startswith("GPU time in NCCL kernels")
            # one profiled step against the median of the recorded ones: the same measure, not the same step
            assert 0 < mine["collective_share"] < 1
            assert ran[mode][r]["collective_share"] == pytest.approx(mine["collective_share"], abs=0.15)


def test_trace_tp_2_writes_one_trace_directory_per_rank_each_analysed_as_any_trace(tmp_path, cli, tiny_tp2_traces):
    made = tiny_tp2_traces  # recorded once per test run (conftest), as test_analyze_ranks reads it
    assert made.name.endswith("-tiny-both-tp2") and sorted(p.name for p in made.iterdir()) == ["rank0", "rank1"]
    for rank in (0, 1):
        directory = made / f"rank{rank}"
        assert json.loads((directory / "summary.json").read_text())["rank"] == rank
        # each mode in a process of its own, on every rank: each profiler session its process's first
        pids = {mode: {e["pid"] for e in json.loads((directory / f"{mode}.json").read_text())["traceEvents"]
                       if e.get("ph") == "X" and e.get("cat") == "cpu_op"} for mode in ("eager", "graph")}
        assert len(pids["eager"]) == len(pids["graph"]) == 1 and pids["eager"] != pids["graph"]
        for mode in ("eager", "graph"):
            out = tmp_path / f"{rank}-{mode}.json"
            assert cli("analyze", directory / f"{mode}.json", "--json", out).exit_code == 0
            analysed = json.loads(out.read_text())["traces"][0]
            raw = json.loads((directory / f"{mode}.json").read_text())["traceEvents"]
            (steps,) = [group["steps"] for group in analysed["step_groups"]]
            # eager steps open each AllReduce module's range; a graph's fired at its capture, and
            # its replay shows gloo's own range around each collective. Either way, recomputed
            # from the raw trace: 2 per layer (tiny has 2) in every recorded step.
            mine = (lambda n: n.endswith(" (AllReduce)")) if mode == "eager" else (lambda n: n == "gloo:all_reduce")
            ranges = [e for e in raw if mine(e.get("name", "")) and e.get("cat") != "cpu_op"]
            rows = [r for r in analysed["by_name"] if mine(r["key"])]
            assert len(ranges) == 4 * steps == sum(r["count"] for r in rows)
            assert sum(r["total_ns"] for r in rows) == pytest.approx(sum(e["dur"] for e in ranges) * 1e3)
    result = cli("analyze", made)  # the directory holding both: rank by rank (test_analyze_ranks)
    assert result.exit_code == 0 and f"{made}: 2 ranks" in result.stdout


@pytest.mark.processes
@pytest.mark.inductor
@pytest.mark.compiles
def test_tp_2_compiles_the_step_with_its_all_reduces_and_generates_eagers_tokens(tmp_path):
    out = tmp_path / "run.json"
    proc = graphrt("run", "--model", "tiny", "--tp", "2", "--mode", "eager,compile", "--steps", "6",
                   "--json", str(out))
    _, stderr = proc.communicate(timeout=3 * BOUND_S)  # a compile per rank
    assert proc.returncode == 0, stderr
    doc = json.loads(out.read_text())
    assert doc["modes"]["compile"]["equivalence"]["identical"]
    for rank in doc["ranks"]["compile"]:
        assert rank["generated_ids"] == doc["modes"]["eager"]["generated_ids"]
