"""The process that records one mode: `python -m graphrt.trace.record.child SPEC.json RECORDED.json [CHROME.json]`.

SPEC.json holds a RunSpec (as graphrt.trace.record.make_traces writes it). The model is loaded and warmed up
outside the recording; the steps after the warmup run inside the recording window:
- without CHROME.json, `nsys_window`, which opens the range or calls cudaProfilerStart that the
  `nsys profile` this process runs under waits for;
- with it, `torch_window`: this process's first torch.profiler session, the only one in which
  CUPTI 13.0 links graph kernels to their launches (graphrt.measure.profiling), written to CHROME.json.
On CUDA nothing else is profiled (the trace has the step's counts); on the CPU the step's ops are
counted by dispatch, without a profiler. What each mode did (RecordedMode) goes to RECORDED.json.
Bad input or an environment that cannot record is one line on stderr and exit status 1: nsys
passes the status on, and the parent shows that line.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from graphrt.errors import GraphrtError
from graphrt.io import write_json
from graphrt.run import execute
from graphrt.trace.record.make_traces import spec_from_dict
from graphrt.trace.record.record_modes import nsys_window, record_modes, torch_window


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python -m graphrt.trace.record.child SPEC.json RECORDED.json [CHROME.json]", file=sys.stderr)
        return 2
    spec_path, recorded_path, *chrome = argv
    try:
        with open(spec_path) as f:
            spec = spec_from_dict(json.load(f))
        config, model, device, _ = execute.load(spec)
        window = (lambda mode: torch_window(device, Path(chrome[0]))) if chrome else (lambda mode: nsys_window(device))
        # on CUDA the trace counts: torch.profiler cannot count under nsys (one CUPTI subscriber),
        # and under torch.profiler a count would be a second session
        recorded = record_modes(spec, config, model, window=window, count=device.type != "cuda")
        write_json(recorded_path, [asdict(r) for r in recorded])
    except GraphrtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
