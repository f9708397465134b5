"""A range named like an engine's step marker that states what no engine writes marks no step:
it is left out of the steps and named in one note line (its text, cut where long, and the form
that was expected), so no figure holds its value (graphrt.trace.analysis.markers, `Unread`).

Each case is a hand-written torch.profiler trace: the marker around one kernel launch, beside a
good marker of the same engine whose step must still be read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphrt.cli.main import main
from graphrt.engines.step_marker import COUNT_BOUND
from graphrt.trace.analysis.markers import parse, unread


def _trace(tmp_path: Path, names: list[str]) -> Path:
    """One step a name, 100 µs apart, each launching one kernel."""
    events = []
    for i, name in enumerate(names):
        at = 100.0 * i
        events += [{"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": at, "dur": 90},
                   {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": at + 10,
                    "dur": 1, "args": {"correlation": i + 1}},
                   {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": at + 20, "dur": 1,
                    "args": {"device": 0, "stream": 7, "correlation": i + 1}}]
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _analyze(tmp_path: Path, names: list[str]) -> tuple[int, str, dict]:
    out = tmp_path / "figures.json"
    result = CliRunner().invoke(main, ["analyze", str(_trace(tmp_path, names)), "--json", str(out)])
    return result.exit_code, result.output, json.loads(out.read_text())["traces"][0]


BIG = "9" * 5000  # past the 4,300 digits Python makes an int of


@pytest.mark.parametrize("bad, good, said", [
    ("decode[bs=200/128 tok=200]", "decode[bs=117/128 tok=117]",
     "`decode[bs=200/128 tok=200]` states 200 real rows in a graph of 128 (expected at most the graph's size)"),
    ("step[DRAFT_LOOP raw_bs=9 bs=4 topk=1]", "step[DRAFT_LOOP raw_bs=3 bs=4 topk=1]",
     "`step[DRAFT_LOOP raw_bs=9 bs=4 topk=1]` states 9 real rows in a graph of 4"),
    ("decode[bs=0]", "decode[bs=1]", "`decode[bs=0]` states a decode step of 0 requests (expected 1 or more)"),
    ("step[EXTEND bs=0 toks=0]", "step[EXTEND bs=1 toks=9]", "states a prefill step of 0 requests"),
    ("replay[bs=0]", "replay[bs=8]", "`replay[bs=0]` states a graph of 0 rows (expected 1 or more)"),
    ("decode[bs=100000000000000000000000]", "decode[bs=2]",
     "states bs=100000000000000…, past any batch (engines count below 2**31)"),
    (f"decode[bs={COUNT_BOUND}]", f"decode[bs={COUNT_BOUND - 1}]", f"states bs={COUNT_BOUND}, past any batch"),
    (f"execute_context_0(0)_generation_{BIG}({BIG})", "execute_context_0(0)_generation_4(4)",
     "states generation=999999999999999…, past any batch"),
    (f"step[DECODE bs={BIG}]", "step[DECODE bs=3]", "states bs=999999999999999…, past any batch"),
    ("replay[bs=\u00b2]", "replay[bs=2]", "`replay[bs=\u00b2]` states bs=\u00b2, not a count"),
    ("step[DECODE bs=abc]", "step[DECODE bs=3]", "`step[DECODE bs=abc]` does not read as one"),
    ("[Executor] _forward_step 4: 1 ctx reqs", "[Executor] _forward_step 5: 1 ctx reqs, 2 gen reqs",
     "named like TensorRT-LLM's _forward_step: N ctx reqs, N gen reqs mark no step"),
])
def test_a_marker_stating_what_no_engine_writes_is_left_out_and_named_in_one_note(tmp_path, bad, good, said):
    code, text, trace = _analyze(tmp_path, [good, bad, bad])
    assert code == 0
    assert [s["name"] for s in trace["steps"]] == [good]  # the good step is read, the bad ones are not steps
    (note,) = [n for n in trace["notes"] if "mark no step" in n]  # once, for both ranges
    assert note.startswith("2 ranges named like ") and said in note and note in text
    assert len(note) < 300  # the name is cut in the line
    bad_values = {s for s in (bad.split("=")[-1].rstrip("]").split("/")) if s.isdigit()}
    assert not bad_values & {str(v) for s in trace["steps"] for v in (s["batch"], s["padded_to"], s["tokens"])}


def test_one_note_per_form_names_the_first_name_and_counts_the_others():
    found = unread(["step[DECODE bs=abc]", "aten::mm", "step[DECODE bs=x]", "decode[bs=0]", "step[DECODE bs=abc]"])
    assert [(u.name, u.expected.split("'")[0]) for u in found] == [
        ("step[DECODE bs=abc]", "SGLang"), ("step[DECODE bs=x]", "SGLang"), ("decode[bs=0]", "ATOM")]


@pytest.mark.parametrize("name", ["step[IDLE bs=0]", "execute_context_0(0)_generation_0(0)", "execute_new_0_cached_0",
                                  "[Executor] _forward_step 43: 0 ctx reqs, 0 ctx tokens, 0 gen reqs",
                                  "step[EXTEND bs=2 toks=14721 c_sqsq=99999999999999]",
                                  "decode[bs=128/128 tok=128]", "executed_model", "stepper[1]", "decoder[x]"])
def test_what_engines_do_write_is_read_and_other_names_are_no_marker(name):
    assert unread([name]) == []
    assert (parse(name) is None) == (name in ("executed_model", "stepper[1]", "decoder[x]"))


def test_a_trace_whose_only_marker_does_not_parse_says_both_that_it_has_no_step_and_why(tmp_path):
    code, text, trace = _analyze(tmp_path, ["step[DECODE bs=abc]"])
    assert code == 0 and trace["steps"] == []
    assert any(n.startswith("no step marker") for n in trace["notes"])
    assert "1 range named like SGLang's step[MODE bs=N key=N …] marks no step, left out: `step[DECODE bs=abc]`" in text
