"""Steps run on every rank of a 2-process gloo group by the parallel tests.

Most take the joined group (`me`) and return what a test asserts on: `pool` runs them one after
another on ranks that join once (tests/rank_pool.py). Those that test joining, leaving, a rank
left waiting or what a group leaves behind are functions the launcher starts alone: each joins
the group (or has graphrt join it), runs and leaves.
"""

from __future__ import annotations

import pickle
import traceback
import os
from pathlib import Path

import torch
import torch.distributed as dist

from graphrt.graphs import GraphCaptureError, capture
from graphrt.graphs.agree import check_ranks_agree
from graphrt.measure.opcount import op_names
from graphrt.parallel import ranks as ranks_
from graphrt.run.rank_figures import slowest_per_step


def _all_reduce(x: torch.Tensor, group: str) -> torch.Tensor:
    return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", group))


def pool_file(out: str | Path, job: str, rank: int, kind: str) -> Path:
    """Where `pool` keeps what rank `rank` made of `job`: "result" (pickled) or "failed" (a traceback)."""
    return Path(out, f"{job}.rank{rank}.{kind}")


def pool(jobs: list[tuple[str, list]], out: str) -> None:
    """Join the group once, run each job (a function of this module taking the joined `Ranks`,
    and its further arguments) in turn, and leave: joining twice under the elastic launcher
    fails (gloo times out in its first receive). Each job's result is kept in `out` as soon as
    it returns, so a later failure hides none. A job that raises keeps its traceback and raises
    again: its peer may be waiting in a collective this rank will never issue, and a failed rank
    has the launcher stop every rank at once; the jobs after it do not run."""
    me = ranks_.join("cpu")
    for job, args in jobs:
        try:
            result = globals()[job](me, *args)
        except Exception:
            _keep(pool_file(out, job, me.rank, "failed"), traceback.format_exc().encode())
            raise
        _keep(pool_file(out, job, me.rank, "result"), pickle.dumps(result))
    ranks_.leave()


def _keep(path: Path, data: bytes) -> None:
    """Write `data` whole or not at all: the launcher may kill this rank mid-write when its peer fails."""
    part = path.with_name(path.name + ".part")
    part.write_bytes(data)
    os.replace(part, path)


def tape_of_all_reduce(me: ranks_.Ranks) -> dict:
    """A step that all-reduces its input: the ops it dispatches, its tape, and a replay after
    the input changed."""
    x = torch.full((4,), float(me.rank + 1))

    def step() -> torch.Tensor:
        return _all_reduce(x * 2, me.group) + 1

    dispatched = op_names(step)
    graph, out = capture(step, device="cpu")
    x.fill_(10.0 * (me.rank + 1))
    graph.replay()
    replayed = out.clone()
    eager = step()
    return {"dispatched": dispatched, "tape": list(graph.op_names), "replayed": replayed, "eager": eager}


REFUSAL_CASES = ("rank 0 only", "order", "shape", "unwaited", "unwaited first of two", "unwaited second of two")


def refusals(me: ranks_.Ranks) -> dict[str, list[str]]:
    """Per faulty step of `REFUSAL_CASES`, what check_ranks_agree (and, for "unwaited", a tape
    capture too) says of it."""
    return {case: _refusal(case, me) for case in REFUSAL_CASES}


def _refusal(case: str, me: ranks_.Ranks) -> list[str]:
    x = torch.ones(2, 3)
    ops = torch.ops._c10d_functional

    def step() -> torch.Tensor:
        if case == "rank 0 only":
            return _all_reduce(x, me.group) if me.rank == 0 else x * 2
        if case == "order":
            a, b = (x, x.sum(0)) if me.rank == 0 else (x.sum(0), x)
            return _all_reduce(a, me.group).sum() + _all_reduce(b, me.group).sum()
        if case == "shape":
            return _all_reduce(x[: me.rank + 1], me.group)
        if case == "unwaited":
            return ops.all_reduce(x, "sum", me.group)
        # the one left unwaited is [2, 3]; the waited one [1, 3]
        if case == "unwaited first of two":
            return ops.all_reduce(x, "sum", me.group), _all_reduce(x[:1], me.group)
        if case == "unwaited second of two":
            return _all_reduce(x[:1], me.group), ops.all_reduce(x, "sum", me.group)
        return _all_reduce(x, me.group)

    said = []
    try:
        check_ranks_agree(step)
    except GraphCaptureError as e:
        said.append(str(e))
    if case.startswith("unwaited"):
        try:
            capture(step, device="cpu", warmup=0)
        except GraphCaptureError as e:
            said.append(str(e))
        dist.barrier()
    return said


def tp_decode(me: ranks_.Ranks, models: list[str], prompt: torch.Tensor, steps: int) -> dict[str, dict]:
    """Per model (a preset or a HF directory): decode `prompt` greedily on this rank's share of
    it through eager, piecewise and graph; per mode the tokens and kept logits, the graph's tape
    with each op's ranges, and the rank's parameters."""
    return {model: _tp_decode(model, me, prompt, steps) for model in models}


def _tp_decode(model: str, me: ranks_.Ranks, prompt: torch.Tensor, steps: int) -> dict:
    from graphrt.backends.factory import make_backend
    from graphrt.model.resolve import resolve
    from graphrt.model.weights import build_model
    from graphrt.run.decode import decode

    config, checkpoint = resolve(model)
    from graphrt.measure import nvtx

    net = build_model(config, me.device, torch.float32, checkpoint=checkpoint, seed=0, ranks=me)
    nvtx.attach(net)  # module ranges, as a run attaches them: the tape keeps each op's
    net.setup_cache(prompt.shape[0], prompt.shape[1] + steps)
    out = {"parameters": {name: p.clone() for name, p in net.state_dict().items()}}
    for mode in ("eager", "piecewise", "graph"):
        backend = make_backend(mode, net)
        backend.prepare(prompt.shape[0])
        gen = decode(backend, prompt, steps)
        out[mode] = {"tokens": gen.tokens, "logits": torch.stack(gen.logits)}
        if mode == "graph":
            tape = backend.graphs[backend.buckets[0]][0]
            out["tape"] = list(tape.op_names)
            out["tape_ranges"] = list(tape.op_ranges)
        del backend  # graphs go before the process group does
    return out


def slowest_of_steps(me: ranks_.Ranks) -> list[float]:
    """Each rank's own step times (rank 0 slower at step 0, rank 1 at step 1), and what
    `slowest_per_step` makes of them."""
    return slowest_per_step([[1.0, 5.0, 2.0], [3.0, 2.0, 2.0]][me.rank])


def raises_on(me: ranks_.Ranks, rank: int) -> None:
    """Rank `rank` raises; every other waits for it in a barrier it never reaches."""
    if me.rank == rank:
        raise ValueError(f"planted on rank {rank}")
    dist.barrier()


def disagreeing_capture(lint: bool) -> str | None:
    """tiny on 2 ranks, rank 1's step issuing one all-reduce more (after the final norm): what
    preparing a graph backend says of it, the lint included or not. A rank that would wait in
    a collective its peer never issues is ended by an alarm, so a hang fails the launch."""
    import signal

    from graphrt.backends.factory import make_backend
    from graphrt.model.resolve import resolve
    from graphrt.model.weights import build_model

    signal.alarm(60)
    me = ranks_.join("cpu")
    config, _ = resolve("tiny")
    net = build_model(config, me.device, torch.float32, seed=0, ranks=me)
    net.setup_cache(1, 8)
    if me.rank == 1:
        norm, forward = net.model.norm, net.model.norm.forward
        norm.forward = lambda x: _all_reduce(forward(x), me.group)
    try:
        make_backend("graph", net, lint=lint).prepare(1)
        said = None
    except GraphCaptureError as e:
        said = str(e)
    ranks_.leave()
    signal.alarm(0)
    return said


def disagreeing_run() -> str | None:
    """`graphrt run --model tiny --tp 2 --mode eager` with rank 1's step issuing one all-reduce
    more: what the run says of it (an alarm ends a rank that would wait forever)."""
    import os
    import signal

    from graphrt.run import execute
    from graphrt.run.spec import RunSpec

    signal.alarm(60)
    build = execute.load_model

    def planted(*args, **kwargs):
        net = build(*args, **kwargs)
        if os.environ["RANK"] == "1":
            norm, forward = net.model.norm, net.model.norm.forward
            norm.forward = lambda x: _all_reduce(forward(x), dist.group.WORLD.group_name)
        return net

    execute.load_model = planted
    try:
        execute.run(RunSpec(model="tiny", tp=2, mode="eager", steps=3))
        said = None
    except GraphCaptureError as e:
        said = str(e)
    signal.alarm(0)
    return said


def threads_started_and_left() -> list[str]:
    """The threads a rank runs once it has left the group that it did not run before joining,
    after a step that all-reduces under torch.profiler (as `run --tp` measures each mode's
    collective share). Linux names each thread in /proc."""
    before = _thread_names()
    me = ranks_.join("cpu")
    with torch.profiler.profile():
        _all_reduce(torch.ones(4), me.group)
    ranks_.leave()
    return sorted(set(_thread_names()) - set(before))


def _thread_names() -> list[str]:
    return [task.read_text().strip() for task in Path("/proc/self/task").glob("*/comm")]


def capture_error_mode_in_a_group() -> str:
    """The capture error mode a rank's captures run under while its group is live."""
    from graphrt.graphs.cuda import capture_error_mode

    ranks_.join("cpu")
    mode = capture_error_mode()
    ranks_.leave()
    return mode
