"""A Chrome-trace value no profiler writes is refused by its event: one line naming the file, the
event's index and name, the field, its value and what was expected, a non-zero exit, and no
figure made (graphrt.trace.read.chrome_events). A negative duration or a time past 64 bits of
nanoseconds says the file's clock cannot be trusted for its other times either; an id that is a
fraction would be cut to some other id; so the trace is refused, not read around.

The bad values are planted in the real A100 trace (tests/data/torch), and in a small one."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphrt.cli.main import main

A100 = Path(__file__).parents[1] / "data" / "torch" / "hta-a100-alexnet-eager.json.gz"


def _a100() -> dict:
    return json.loads(gzip.decompress(A100.read_bytes()))


def _analyze(tmp_path: Path, doc: dict) -> tuple[int, str, bool]:
    """(exit code, what it said, whether it wrote any figure) of `graphrt analyze` on `doc`."""
    path, out = tmp_path / "planted.json", tmp_path / "figures.json"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["analyze", str(path), "--json", str(out)])
    return result.exit_code, result.output.strip(), out.exists()


def _last(doc: dict, cat: str) -> tuple[int, dict]:
    """The index and event of the last complete event of a category."""
    return next((i, e) for i, e in reversed(list(enumerate(doc["traceEvents"])))
                if e.get("ph") == "X" and e.get("cat") == cat)


@pytest.mark.parametrize("cat, field, value, said", [
    ("kernel", "dur", -3.5, "dur -3.5 is negative: expected a duration of 0 µs or more"),
    ("user_annotation", "dur", -1, "dur -1 is negative: expected a duration of 0 µs or more"),
    ("cpu_op", "ts", 2**62, f"ts {2**62} and dur {{dur}} µs end past 64 bits of nanoseconds: expected a time on a "
                            "profiler's clock"),
    ("cuda_runtime", "args.correlation", 7.5,
     "args.correlation 7.5 is not a whole number that fits 64 bits: expected a launch's correlation id"),
    ("cuda_runtime", "args.correlation", "abc",
     "args.correlation 'abc' is not a whole number that fits 64 bits: expected a launch's correlation id"),
    ("kernel", "args.device", "gpu0", "args.device 'gpu0' is not a whole number that fits 64 bits: expected a device's index"),
    ("kernel", "args.stream", 2**64, f"args.stream {2**64} is not a whole number that fits 64 bits: expected a stream's id"),
    ("kernel", "args.graph node id", 0.5,
     "args.graph node id 0.5 is not a whole number that fits 64 bits: expected a graph node's id"),
    ("cpu_op", "pid", 1.5, "pid 1.5 is not a whole number that fits 64 bits: expected a process or thread id, or a label"),
    ("cpu_op", "tid", -(2**64), f"tid {-(2**64)} is not a whole number that fits 64 bits: expected a process or "
                                "thread id, or a label"),
])
def test_a_value_no_profiler_writes_is_refused_by_its_event_in_one_line(tmp_path, cat, field, value, said):
    doc = _a100()
    i, event = _last(doc, cat)
    if field.startswith("args."):
        event["args"][field[5:]] = value
    else:
        event[field] = value
    code, text, wrote = _analyze(tmp_path, doc)
    assert code == 1 and not wrote
    assert text == (f"error: {tmp_path / 'planted.json'}: a Chrome-trace event lacks a usable field "
                    f"(traceEvents[{i}] `{_cut(event['name'])}`: {said.format(dur=event.get('dur'))})")


def _cut(name: str) -> str:
    """An event's name as a line shows it: 60 characters at most, the last an ellipsis."""
    return name if len(name) <= 60 else name[:59] + "…"


def test_a_long_event_name_is_cut_in_the_refusal(tmp_path):
    doc = _a100()
    i, event = _last(doc, "kernel")
    event.update(name="k" * 2_000_000, dur=-1)
    code, text, _ = _analyze(tmp_path, doc)
    assert code == 1 and len(text) < 300 and f"(traceEvents[{i}] `{'k' * 59}…`: dur -1 is negative" in text


def test_a_duration_of_zero_and_a_float_that_is_a_whole_id_are_read(tmp_path):
    doc = _a100()
    _, kernel = _last(doc, "kernel")
    kernel["dur"] = 0
    _, call = _last(doc, "cuda_runtime")
    call["args"]["correlation"] = float(call["args"]["correlation"])
    code, _, wrote = _analyze(tmp_path, doc)
    assert code == 0 and wrote
