"""How `graphrt analyze` scales with the size of a Chrome trace, against `json.load` of the same file.

    python scripts/bench_trace.py                       # the V100 trace grown 1x, 4x, 16x
    python scripts/bench_trace.py --copies 1,4 --repeats 3 --trace other.json.gz

A real torch.profiler trace is grown N times: copy c is the same events later in time (each copy
starts after the one before ends), with its correlation, flow and external ids and its
`ProfilerStep#N` numbers shifted past the copy before, so the grown trace is N times the steps of
the original, each as it was. Each grown trace is written plain (JSON) to a temporary directory,
then each measurement runs in a fresh interpreter: wall time and peak RSS (the process's own,
from wait4), the median over the repeats. Also `graphrt --help` against `import torch`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO / "tests" / "data" / "torch" / "hta-v100-graph-launches.json.gz"
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


def grow(source: Path, copies: int, out: Path) -> int:
    """Write `source` grown `copies` times to `out` (plain JSON, one event a line); returns the
    number of events written."""
    data = _load(source)
    head = {k: v for k, v in data.items() if k != "traceEvents"}
    n = 0
    with out.open("w") as f:
        f.write(json.dumps(head)[:-1] + (", " if head else "") + '"traceEvents": [\n')
        for e in grown_events(data, copies):
            f.write(("" if n == 0 else ",\n") + json.dumps(e))
            n += 1
        f.write("\n]}\n")
    return n


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="a real Chrome trace (.json or .json.gz)")
    parser.add_argument("--copies", default="1,4,16", help="how many times to grow it, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement below 100 MB (median)")
    parser.add_argument("--gzip", action="store_true", help="also analyze each grown trace gzipped")
    args = parser.parse_args()
    py = sys.executable
    env_note = f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphrt-bench-trace-") as tmp:
        for copies in map(int, args.copies.split(",")):
            path = Path(tmp) / f"grown-{copies}x.json"
            events = grow(args.trace, copies, path)
            size = path.stat().st_size
            repeats = args.repeats if size < 100e6 else 1
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
                rows.append((copies, form, events, size, an_s, an_rss, load_s, load_rss))
                print(f"  {copies}x {form}: {events:,} events, {size / 1e6:,.0f} MB: analyze {an_s:.2f} s "
                      f"{an_rss / 2**20:,.0f} MiB; json.load {load_s:.2f} s {load_rss / 2**20:,.0f} MiB",
                      file=sys.stderr, flush=True)
            path.unlink()
        help_s, _ = median_of([py, "-m", "graphrt", "--help"], 5)
        torch_s, _ = median_of([py, "-c", "import torch"], 5)

    print(f"graphrt analyze on {args.trace.name} grown N times ({env_note})\n")
    header = ("N", "form", "events", "MB", "analyze s", "peak RSS MiB", "events/s",
              "json.load s", "json.load RSS MiB", "time / json.load", "RSS / json.load")
    lines = [header] + [
        (f"{c}x", form, f"{ev:,}", f"{size / 1e6:,.0f}", f"{a_s:.2f}", f"{a_rss / 2**20:,.0f}",
         f"{ev / a_s:,.0f}", f"{l_s:.2f}", f"{l_rss / 2**20:,.0f}", f"{a_s / l_s:.2f}", f"{a_rss / l_rss:.2f}")
        for c, form, ev, size, a_s, a_rss, l_s, l_rss in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths)))
    plain = {c: a_s for c, form, _, _, a_s, *_ in rows if form == "plain"}
    if 4 in plain and 16 in plain:
        print(f"\n16x the events take {plain[16] / plain[4]:.2f}x the time of 4x")
    print(f"graphrt --help {help_s:.2f} s, import torch {torch_s:.2f} s: {help_s / torch_s:.2f}x")


if __name__ == "__main__":
    main()
