"""Bad options get one line naming the option and a non-zero exit, before any work: never a
traceback, never a value taken as another (docs/design.md, Invariants, 8).

Where an option sizes memory (a batch, a bucket, a traffic's largest batch), the command runs in
a process that may not map more than 2 GiB: a check that came after the allocation would fail
there with a traceback, never by growing for minutes."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphrt.backends.factory import make_backend
from graphrt.cli.option_types import Amount
from graphrt.errors import GraphrtError
from graphrt.measure import hardware
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model
from graphrt.run.footprint import cache_rows, check_fits, footprint
from graphrt.run.spec import RunSpec

HUGE = 10**12  # rows or sizes no machine holds: a structure of them that is built fails at once
MEMORY_LIMIT = 2 << 30  # bytes a bounded command may map


def _one_error_line(result) -> str:
    """The error a failed command printed: exactly one line, no traceback."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _bounded(*args: object) -> subprocess.CompletedProcess:
    """`graphrt ARGS` in a fresh process that may map at most MEMORY_LIMIT bytes."""
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))  # noqa: E731
    return subprocess.run([sys.executable, "-m", "graphrt", *map(str, args)], capture_output=True,
                          text=True, preexec_fn=limit, cwd=Path(__file__).parents[2])


def _bounded_error(*args: object) -> str:
    done = _bounded(*args)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and not done.stdout, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.stderr.strip().endswith(line), done.stderr  # nothing after the error
    return line


@pytest.fixture
def traffic(tmp_path) -> Path:
    path = tmp_path / "traffic.json"
    path.write_text('{"1": 10, "4": 5}')
    return path


# --- float options ---------------------------------------------------------------------------

FLOAT_OPTIONS = [("plan", "--memory"), ("plan", "--capture-seconds"), ("plan", "--device-memory"),
                 ("trace", "--timeout")]


@pytest.mark.parametrize("command, option", FLOAT_OPTIONS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_every_float_option_refuses_values_that_are_not_finite(cli, traffic, command, option, value):
    extra = ["--traffic", traffic] if command == "plan" else []
    line = _one_error_line(cli(command, *extra, option, value))
    assert f"'{option}'" in line and "not a finite number" in line


@pytest.mark.parametrize("option", ["--device-memory", "--memory", "--capture-seconds"])
def test_an_amount_that_rounds_to_nothing_in_its_unit_is_refused_not_taken_as_zero(cli, traffic, option):
    line = _one_error_line(cli("plan", "--traffic", traffic, option, "1e-300"))
    assert f"'{option}'" in line and "would count as 0" in line


def test_an_amount_keeps_zero_where_zero_is_allowed_and_anything_of_at_least_one_unit():
    mib = Amount(min=0, quantum=2**-20, quantum_said="byte")
    assert mib.convert("0", None, None) == 0.0
    assert mib.convert(str(2**-20), None, None) == 2**-20
    with pytest.raises(Exception, match="less than one byte"):
        mib.convert(str(2**-22), None, None)


# --- --tp, --seed, --buckets, --check ---------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "trace"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_tp_must_be_positive_where_given(cli, command, value):
    line = _one_error_line(cli(command, "--model", "tiny", "--tp", value))
    assert "'--tp'" in line and "x>=1" in line


def test_a_spec_made_with_tp_0_is_refused_and_without_tp_means_as_many_as_launched():
    with pytest.raises(GraphrtError, match="--tp must be a positive integer, got 0"):
        RunSpec(tp=0)
    assert RunSpec().tp is None


@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_seed_torch_cannot_take_is_refused_by_name(cli, traffic, command):
    extra = ["--traffic", traffic] if command == "plan" else ["--model", "tiny"]
    line = _one_error_line(cli(command, *extra, "--seed", str(2**64)))
    assert "'--seed'" in line


def test_an_empty_model_is_refused_by_name_not_taken_as_this_directory(cli):
    assert "--model ''" in _one_error_line(cli("run", "--model", ""))


def test_an_empty_bucket_list_is_refused_by_name(cli):
    assert "--buckets ''" in _one_error_line(cli("run", "--model", "tiny", "--buckets", ""))


def test_a_bad_check_list_names_check_not_buckets(cli, traffic):
    line = _one_error_line(cli("plan", "--traffic", traffic, "--check", "0,-1"))
    assert line.startswith("error: --check '0,-1'") and "--buckets" not in line


# --- memory, checked before anything is allocated -------------------------------------------

@pytest.mark.processes
@pytest.mark.parametrize("command", ["run", "trace"])
def test_a_batch_no_machine_holds_is_refused_naming_it_before_anything_is_allocated(command):
    line = _bounded_error(command, "--model", "tiny", "--batch", HUGE)
    assert f"--batch {HUGE:,}" in line and "KV cache" in line and "give a smaller --batch" in line


@pytest.mark.processes
def test_a_bucket_no_machine_holds_is_refused_naming_the_buckets():
    line = _bounded_error("run", "--model", "tiny", "--buckets", f"1,{HUGE}", "--steps", 4)
    assert f"--buckets 1,{HUGE}" in line and f"{HUGE:,} rows" in line


@pytest.mark.processes
def test_a_traffic_batch_no_machine_holds_is_refused_before_the_sizes_to_measure_are_listed(tmp_path):
    path = tmp_path / "traffic.json"
    path.write_text(json.dumps({str(10**18): 1}))
    line = _bounded_error("plan", "--model", "tiny", "--traffic", path, "--no-verify")
    assert f"the traffic's largest batch {10**18:,}, run as batch {2**60:,} by a list" in line


@pytest.mark.processes
def test_a_bad_check_list_whose_size_no_machine_holds_is_refused_before_the_sizes_are_listed(traffic):
    line = _bounded_error("plan", "--model", "tiny", "--traffic", traffic, "--check", f"1,{10**18}", "--no-verify")
    assert f"run as batch {10**18:,} by a list" in line


@pytest.mark.processes
@pytest.mark.parametrize("option", ["--steps", "--prompt-len"])
def test_plan_names_the_steps_and_prompt_for_a_cache_longer_than_the_model_not_the_batch(option, traffic):
    line = _bounded_error("plan", "--model", "tiny", "--traffic", traffic, option, HUGE, "--no-verify")
    assert f"{option} {HUGE:,}" in line and "max_position_embeddings" in line and "batch" not in line


@pytest.mark.parametrize("command, option", [("plan", "--verify-steps"), ("trace", "--overhead"),
                                             ("bench", "--repeats")])
def test_a_count_of_steps_to_time_is_bounded_before_any_is_sampled(cli, traffic, command, option):
    extra = {"plan": ["--traffic", traffic], "bench": ["baseline"]}.get(command, [])
    line = _one_error_line(cli(command, *extra, option, str(HUGE)))
    assert f"'{option}'" in line and "1000000" in line


def test_a_run_that_takes_a_tenth_of_the_free_memory_or_more_says_so_and_a_small_one_says_nothing():
    free = hardware.memory(torch.device("cpu")).free
    one, two = (footprint(RunSpec(model="tiny", batch=b, mode="eager"), PRESETS["tiny"], 4).needed for b in (1, 2))
    batch = free // 5 // (two - one)  # about a fifth of what is free: checked, never allocated
    line = check_fits(RunSpec(model="tiny", batch=batch, mode="eager"))
    assert line.startswith("run: at least ") and f"({batch:,} rows x 48 positions)" in line and "free" in line
    assert check_fits(RunSpec(model="tiny", mode="eager")) is None


@pytest.mark.parametrize("mode, buckets", [("eager", None), ("graph", None), ("graph", (1, 8)), ("piecewise", None)])
def test_the_footprint_counts_the_weights_and_cache_the_model_allocates(mode, buckets):
    spec = RunSpec(model="tiny", batch=3, steps=4, prompt_len=5, mode=mode, buckets=buckets)
    model = build_model(PRESETS["tiny"], torch.device("cpu"), torch.float32)
    backend = make_backend(mode, model, buckets, lint=False)
    assert cache_rows(spec) == backend.cache_rows(spec.batch)
    model.setup_cache(backend.cache_rows(spec.batch), spec.seq_len)
    held = footprint(spec, PRESETS["tiny"], itemsize=4)
    assert held.weights == sum(p.numel() * p.element_size() for p in model.parameters())
    caches = [layer.self_attn.cache for layer in model.model.layers]
    assert held.cache == sum(t.numel() * t.element_size() for c in caches for t in (c.k, c.v))
    assert held.prefill_logits == 3 * 5 * PRESETS["tiny"].vocab_size * 4


def test_a_rank_of_a_tensor_parallel_run_holds_its_share():
    spec = RunSpec(model="tiny", batch=4, steps=4, mode="eager")
    whole, half = footprint(spec, PRESETS["tiny"], 4), footprint(spec, PRESETS["tiny"], 4, share=2)
    assert half.needed == pytest.approx(whole.needed / 2, abs=4)


# --- --plot's needs, first ------------------------------------------------------------------

@pytest.mark.parametrize("command", ["analyze", "plan"])
def test_plot_without_matplotlib_is_refused_first_with_the_command_that_installs_it(cli, monkeypatch, tmp_path,
                                                                                       traffic, command):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an environment without matplotlib
    args = [tmp_path / "missing-trace.json"] if command == "analyze" else ["--traffic", traffic]
    result = cli(command, *args, "--plot", tmp_path / "step.png")
    line = _one_error_line(result)
    assert line == "error: --plot needs matplotlib, which is not installed here: pip install 'graphrt[plot]'"
    assert result.stdout == ""  # refused before the missing trace was even looked for


# --- long names in text, whole in JSON --------------------------------------------------------

def test_a_long_range_name_is_cut_in_the_text_and_kept_whole_in_the_json(cli, tmp_path):
    name = "module_" + "x" * 100_000
    events = [{"ph": "X", "cat": "user_annotation", "name": n, "ts": 1000.0 * s + 1, "dur": 40.0,
               "pid": 1, "tid": 1, "args": {}} for s in range(3) for n in ("decode_step[eager]", name)]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 1000.0 * s + 5, "dur": 2.0,
                "pid": 1, "tid": 1, "args": {}} for s in range(3)]
    trace, out = tmp_path / "long.json", tmp_path / "figures.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    result = cli("analyze", trace, "--json", out)
    assert result.exit_code == 0, result.output
    assert max(map(len, result.stdout.splitlines())) < 300
    assert "module_xxx" in result.stdout and "…" in result.stdout
    names = [f["key"] for f in json.loads(out.read_text())["traces"][0]["by_name"]]
    assert name in names
