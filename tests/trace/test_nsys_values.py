"""An Nsight Systems export row holding what `nsys export` never writes (an end before its start,
a NULL or text where a time or id belongs) is refused in one line naming the file, the table, the
row and the value, with a non-zero exit: read, it became a negative step time, a step of 2**63 ns,
or a traceback (graphrt.trace.read.nsys_sqlite._check_rows). The exports are written here in
nsys's layout, as tests/trace/test_nsys_rules.py writes them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from test_nsys_rules import KERNEL, NVTX, RUNTIME, _export, _tid

from graphrt.cli.main import main

CALL, RAN, STEP = (100, 200, _tid(1, 1), 1, 1), (250, 350, 0, 1), (50, 500, 59, _tid(1, 1), "decode[bs=2]")
EXPECTED = "expected integer nanoseconds and ids, each span ending at or after its start, as nsys export writes them"


def _analyze(tmp_path: Path, call: tuple = CALL, ran: tuple = RAN, step: tuple = STEP) -> tuple[int, str, Path]:
    path = _export(tmp_path / "planted.sqlite", {1: "cudaLaunchKernel_v7000"}, **{
        RUNTIME: (["start", "end", "globalTid", "correlationId", "nameId"], [CALL, call]),
        KERNEL: (["start", "end", "deviceId", "correlationId"], [RAN, ran]),
        NVTX: (["start", "end", "eventType", "globalTid", "text"], [STEP, step])})
    result = CliRunner().invoke(main, ["analyze", str(path)])
    return result.exit_code, result.output.strip(), path


@pytest.mark.parametrize("planted, said", [
    ({"ran": (350, 250, 0, 1)}, "CUPTI_ACTIVITY_KIND_KERNEL row 2: end 250 is before start 350"),
    ({"step": (500, 50, 59, _tid(1, 1), "decode[bs=2]")}, "NVTX_EVENTS row 2: end 50 is before start 500"),
    ({"call": (200, 100, _tid(1, 1), 2, 1)}, "CUPTI_ACTIVITY_KIND_RUNTIME row 2: end 100 is before start 200"),
    ({"step": (None, 500, 59, _tid(1, 1), "decode[bs=2]")}, "NVTX_EVENTS row 2: start None is not an integer"),
    ({"ran": (None, 350, 0, 1)}, "CUPTI_ACTIVITY_KIND_KERNEL row 2: start None is not an integer"),
    ({"ran": (250, 350, None, 1)}, "CUPTI_ACTIVITY_KIND_KERNEL row 2: deviceId None is not an integer"),
    ({"call": (100.5, 200, _tid(1, 1), 2, 1)}, "CUPTI_ACTIVITY_KIND_RUNTIME row 2: start 100.5 is not an integer"),
    ({"call": (100, 200, _tid(1, 1), "x", 1)}, "CUPTI_ACTIVITY_KIND_RUNTIME row 2: correlationId 'x' is not an integer"),
    ({"call": (100, 200, None, 2, 1)}, "CUPTI_ACTIVITY_KIND_RUNTIME row 2: globalTid None is not an integer"),
])
def test_a_row_nsys_never_writes_is_refused_naming_its_table_row_and_value(tmp_path, planted, said):
    code, text, path = _analyze(tmp_path, **planted)
    assert (code, text) == (1, f"error: {path}: {said}; {EXPECTED}")


def test_a_range_never_closed_is_still_left_out_not_refused(tmp_path):
    code, text, _ = _analyze(tmp_path, step=(600, None, 59, _tid(1, 1), "decode[bs=3]"))
    assert code == 0 and "1 step, marked by ATOM" in text
