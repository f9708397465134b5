"""How fast `graphrt analyze` reads a Chrome trace, in how much memory, against `json.load` of the
same file (and Holistic Trace Analysis where it is installed), and how much a directory of rank
traces gains from reading its files at once.

    python scripts/bench_trace.py                       # the V100 and A100 traces grown 1x, 4x, 16x; 4 ranks of 4x
    python scripts/bench_trace.py --copies 16,64 --repeats 1 --ranks 0
    python scripts/bench_trace.py --copies 1,4 --trace other.json.gz --gzip

Two real traces of different shapes by default: HTA's V100 training steps replaying CUDA graphs
(a kernel or a launch call in most events), and HTA's A100 one (rank 0 of 16: graph launches
among launch calls, but most events are `cudaEventQuery` calls, CPU ops and flow events, which
carry no figure). A real torch.profiler trace is grown N times: copy c is the same events later in time (each copy
starts after the one before ends), with its correlation, flow and external ids and its
`ProfilerStep#N` numbers shifted past the copy before, so the grown trace is N times the steps of
the original, each as it was. Each grown trace is written plain (JSON) to a temporary directory,
then each measurement runs in a fresh interpreter: wall time and peak RSS (the process's own,
from wait4; this one holds no trace, as a child's peak counts its parent's at the fork), the
median over the repeats. Bytes per event are what a 4x longer trace adds to the
peak RSS, per event it adds. The rank directory holds `--ranks` traces grown `--rank-copies`
times, each saying which rank it is (distributedInfo): `analyze DIR --jobs 1` reads them one
after another, `analyze DIR` one process per core, the two taken in turns `--repeats` times. Also `graphrt --help` against `import torch`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TORCH_DATA = REPO / "tests" / "data" / "torch"
DEFAULT_TRACES = [TORCH_DATA / "hta-v100-graph-launches.json.gz", TORCH_DATA / "hta-a100-graph-launches.json.gz"]
PROFILER_STEP = "ProfilerStep#"
ID_ARGS = ("correlation", "External id", "Ev Idx")  # ids a copy shifts past the copy before


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return data if isinstance(data, dict) else {"traceEvents": data}


def _extent(events: list[dict]) -> tuple[int, int, int]:
    """(first start, last end, in µs; the largest id the events carry)."""
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    first = min(e["ts"] for e in timed)
    last = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    ids = [int(e["id"]) for e in events if isinstance(e.get("id"), int)]
    ids += [int(a[k]) for e in events if isinstance(a := e.get("args"), dict)
            for k in ID_ARGS if isinstance(a.get(k), int)]
    return first, last, max(ids, default=0)


def _steps(events: list[dict]) -> int:
    numbers = [int(e["name"][len(PROFILER_STEP):]) for e in events
               if str(e.get("name", "")).startswith(PROFILER_STEP) and e["name"][len(PROFILER_STEP):].isdigit()]
    return max(numbers) - min(numbers) + 1 if numbers else 0


def _shifted(event: dict, dt: int | float, did: int, dstep: int) -> dict:
    e = dict(event)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + dt
    if isinstance(e.get("id"), int):
        e["id"] += did
    name = e.get("name")
    if isinstance(name, str) and name.startswith(PROFILER_STEP) and name[len(PROFILER_STEP):].isdigit():
        e["name"] = f"{PROFILER_STEP}{int(name[len(PROFILER_STEP):]) + dstep}"
    if isinstance(args := e.get("args"), dict) and any(isinstance(args.get(k), int) for k in ID_ARGS):
        e["args"] = {**args, **{k: args[k] + did for k in ID_ARGS if isinstance(args.get(k), int)}}
    return e


def grown_events(data: dict, copies: int) -> Iterator[dict]:
    """The trace's events `copies` times, copy c shifted in time, ids and step numbers."""
    events = data["traceEvents"]
    first, last, top_id = _extent(events)
    span, steps = last - first + 1000, _steps(events)  # a millisecond between copies
    for c in range(copies):
        for e in events:
            yield _shifted(e, c * span, c * (top_id + 1), c * steps) if c else e


def grow(source: Path, copies: int, out: Path, rank: int | None = None, world: int | None = None) -> int:
    """Write `source` grown `copies` times to `out` (plain JSON, one event a line), as rank
    `rank` of `world` where given; returns the number of events written."""
    data = _load(source)
    head = {k: v for k, v in data.items() if k != "traceEvents"}
    if rank is not None:
        head["distributedInfo"] = {**head.get("distributedInfo", {}), "rank": rank, "world_size": world}
    n = 0
    with out.open("w") as f:
        f.write(json.dumps(head)[:-1] + (", " if head else "") + '"traceEvents": [\n')
        for e in grown_events(data, copies):
            f.write(("" if n == 0 else ",\n") + json.dumps(e))
            n += 1
        f.write("\n]}\n")
    return n


def grown(source: Path, copies: int, out: Path, rank: int | None = None, world: int | None = None) -> int:
    """`grow` in a process of its own (a child's peak RSS counts its parent's at the fork, so this
    one never holds a trace), the file on disk when it returns."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        events = pool.submit(grow, source, copies, out, rank, world).result()
    os.sync()  # written out now, not while a measurement runs
    return events


def measure(argv: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in bytes) of one fresh process running `argv`, its output discarded."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.read().decode().strip()}")
    return wall, usage.ru_maxrss * 1024  # ru_maxrss is in KiB on Linux


def median_of(argv: list[str], repeats: int) -> tuple[float, int]:
    runs = [measure(argv) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), int(statistics.median(r[1] for r in runs))


# Holistic Trace Analysis reads a directory of traces: one holding a link to the file
HTA = ("import os, sys, tempfile\nfrom hta.trace_analysis import TraceAnalysis\n"
       "with tempfile.TemporaryDirectory() as d:\n"
       "    os.symlink(sys.argv[1], os.path.join(d, os.path.basename(sys.argv[1])))\n"
       "    TraceAnalysis(trace_dir=d)")


def _installed(module: str) -> bool:
    """Whether this interpreter can import `module` (Holistic Trace Analysis, `hta`, is never a
    dependency of graphrt)."""
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def _files(args: argparse.Namespace, source: Path, tmp: Path, hta: bool) -> list[tuple]:
    """Per grown trace and form: (trace, copies, form, events, bytes, analyze s, RSS, json.load s, RSS, HTA s)."""
    py, rows = sys.executable, []
    for copies in map(int, args.copies.split(",")):
        path = tmp / f"grown-{copies}x.json"
        events = grown(source, copies, path)
        size = path.stat().st_size
        repeats = args.repeats if size < 1e9 else 1
        forms = [("plain", path)]
        if args.gzip:
            gz = path.with_suffix(".json.gz")
            with path.open("rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            forms.append(("gzip", gz))
        for form, f in forms:
            opener = "gzip.open" if form == "gzip" else "open"
            load_s, load_rss = median_of([py, "-c", f"import json, gzip; json.load({opener}({str(f)!r}, 'rb'))"], repeats)
            an_s, an_rss = median_of([py, "-m", "graphrt", "analyze", str(f)], repeats)
            hta_s = median_of([py, "-c", HTA, str(f)], repeats)[0] if hta else None
            rows.append((source.name, copies, form, events, size, an_s, an_rss, load_s, load_rss, hta_s))
            print(f"  {source.name} {copies}x {form}: {events:,} events, {size / 1e6:,.0f} MB: analyze {an_s:.2f} s "
                  f"{an_rss / 2**20:,.0f} MiB; json.load {load_s:.2f} s {load_rss / 2**20:,.0f} MiB", file=sys.stderr, flush=True)
        for _, f in forms:
            f.unlink()
    return rows


def _rank_directory(args: argparse.Namespace, tmp: Path, hta: bool) -> tuple[int, float, float, float | None]:
    """(bytes in all, seconds one file after another, seconds a process a file up to one per core,
    Holistic Trace Analysis's seconds on the directory where it is installed)."""
    made = tmp / "ranks"
    made.mkdir()
    for rank in range(args.ranks):
        grown(args.trace[0], args.rank_copies, made / f"rank_{rank}.json", rank, args.ranks)
    size = sum(f.stat().st_size for f in made.iterdir())
    analyze = [sys.executable, "-m", "graphrt", "analyze", str(made)]
    # taken in turns, so that whatever else the machine runs weighs on both alike
    runs = [(measure([*analyze, "--jobs", "1"])[0], measure(analyze)[0]) for _ in range(args.repeats)]
    one_by_one, at_once = (statistics.median(times) for times in zip(*runs))
    script = f"from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir={str(made)!r})"
    hta_s = median_of([sys.executable, "-c", script], args.repeats)[0] if hta else None
    shutil.rmtree(made)
    return size, one_by_one, at_once, hta_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, action="append",
                        help="a real Chrome trace (.json or .json.gz); again for another (default: HTA's V100 and "
                             "A100 traces); the rank directory grows the first")
    parser.add_argument("--copies", default="1,4,16", help="how many times to grow it, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement of a file below 1 GB (median)")
    parser.add_argument("--gzip", action="store_true", help="also analyze each grown trace gzipped")
    parser.add_argument("--ranks", type=int, default=4, help="rank traces in the directory (0: none)")
    parser.add_argument("--rank-copies", type=int, default=4, help="how many times each rank's trace is grown")
    args = parser.parse_args()
    args.trace = args.trace or DEFAULT_TRACES
    hta = _installed("hta")
    with tempfile.TemporaryDirectory(prefix="graphrt-bench-trace-") as tmp:
        rows = [row for source in args.trace for row in _files(args, source, Path(tmp), hta)]
        ranks = _rank_directory(args, Path(tmp), hta) if args.ranks > 1 else None
        help_s, _ = median_of([sys.executable, "-m", "graphrt", "--help"], 5)
        torch_s = median_of([sys.executable, "-c", "import torch"], 5)[0] if _installed("torch") else None

    print(f"graphrt analyze on {', '.join(t.name for t in args.trace)} grown N times (python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs{'' if hta else '; Holistic Trace Analysis not installed'})\n")
    header = ("trace", "N", "form", "events", "JSON MB", "analyze s", "MB/s", "peak RSS MiB", "RSS / file", "json.load s",
              "json.load RSS MiB", "time / json.load", *(("HTA s", "time / HTA") if hta else ()))
    print(_table([header] + [
        (name, f"{c}x", form, f"{ev:,}", f"{size / 1e6:,.0f}", f"{a_s:.2f}", f"{size / 1e6 / a_s:,.0f}",
         f"{a_rss / 2**20:,.0f}", f"{a_rss / size:.2f}", f"{l_s:.2f}", f"{l_rss / 2**20:,.0f}", f"{a_s / l_s:.2f}",
         *((f"{h_s:.2f}", f"{a_s / h_s:.2f}") if hta else ()))
        for name, c, form, ev, size, a_s, a_rss, l_s, l_rss, h_s in rows]))
    plain = {(name, c): (ev, a_rss) for name, c, form, ev, _, _, a_rss, *_ in rows if form == "plain"}
    for name, c in sorted(plain):
        if (name, 4 * c) in plain:
            (ev, rss), (ev4, rss4) = plain[name, c], plain[name, 4 * c]
            print(f"\nheld per event, {name}: {4 * c}x adds {(rss4 - rss) / 2**20:,.0f} MiB of peak RSS to {c}x for "
                  f"{ev4 - ev:,} events: {(rss4 - rss) / (ev4 - ev):.0f} bytes an event")
    if ranks:
        size, one_by_one, at_once, hta_s = ranks
        print(f"\na directory of {args.ranks} rank traces ({args.rank_copies}x each, {size / 1e6:,.0f} MB): one after "
              f"another (--jobs 1) {one_by_one:.2f} s, a process a file {at_once:.2f} s: {at_once / one_by_one:.2f}x the "
              f"time, {one_by_one / at_once:.2f}x as fast" + (f"; Holistic Trace Analysis {hta_s:.2f} s" if hta_s else ""))
    print(f"graphrt --help {help_s:.2f} s" + (f", import torch {torch_s:.2f} s: {help_s / torch_s:.2f}x" if torch_s else ""))


if __name__ == "__main__":
    main()
