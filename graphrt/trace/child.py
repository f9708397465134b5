"""The process `nsys profile` records: `python -m graphrt.trace.child SPEC.json RECORDED.json`.

SPEC.json holds a RunSpec (as graphrt.trace.session writes it). The model is loaded and warmed up
outside the recording; the steps after the warmup run inside `nsys_window`, which opens the range
or calls cudaProfilerStart that `nsys profile` waits for. What each mode did (RecordedMode) goes to
RECORDED.json. Bad input or an environment that cannot record is one line on stderr and exit
status 1: nsys passes the status on, and the parent shows that line.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from graphrt import runner
from graphrt.errors import GraphrtError
from graphrt.io import write_json
from graphrt.trace.record import nsys_window, record_modes
from graphrt.trace.session import spec_from_dict


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m graphrt.trace.child SPEC.json RECORDED.json", file=sys.stderr)
        return 2
    spec_path, recorded_path = argv
    try:
        with open(spec_path) as f:
            spec = spec_from_dict(json.load(f))
        config, model, device, _ = runner.load(spec)
        # on CUDA torch.profiler cannot count under nsys (one CUPTI subscriber): the export counts
        recorded = record_modes(spec, config, model, window=lambda mode: nsys_window(device),
                                count=device.type != "cuda")
        write_json(recorded_path, [asdict(r) for r in recorded])
    except GraphrtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
