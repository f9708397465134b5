"""`graphrt plan` end to end on the tiny model: the table, the JSON, the optimum, the check."""

from __future__ import annotations

import json
import re
from itertools import combinations, cycle

import pytest
from click.testing import CliRunner

from graphrt.plan.measure_sizes import SizeFigures, interpolate
from graphrt.plan.optimize import evaluate
from graphrt.plan.summary import problem_for
from graphrt.cli.main import main

TRAFFIC = {"1": 30, "2": 20, "3": 12, "5": 8, "6": 4}
FAST = ["--model", "tiny", "--steps", "16", "--warmup", "4", "--prompt-len", "4"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One measured plan, shared: its directory, its output and its JSON."""
    where = tmp_path_factory.mktemp("plan")
    (where / "traffic.json").write_text(json.dumps(TRAFFIC))
    result = CliRunner().invoke(main, ["plan", *FAST, "--traffic", str(where / "traffic.json"), "--max-graphs", "3",
                                       "--verify-steps", "300", "--json", str(where / "out.json")])
    assert result.exit_code == 0, result.output
    return where, result.output, json.loads((where / "out.json").read_text())


def test_plan_prints_the_chosen_plan_against_each_engines_default_and_all_eager(planned):
    _, output, doc = planned
    for name in ("chosen", "vLLM", "SGLang", "TensorRT-LLM", "powers of two", "all eager"):
        assert name in output
    assert "mean step ms" in output and "padding %" in output and "graph MiB" in output
    assert re.search(r"vs chosen +90% interval", output)  # each row's difference with its uncertainty
    # the sizes to use, unless the machine was too noisy to choose (this one may be busy)
    exported = f"--buckets {','.join(map(str, doc['chosen']['sizes']))}" in output
    assert exported == (not doc["verdict"]["noisy"])
    assert ("no verdict: the machine is too noisy to choose" in output) == doc["verdict"]["noisy"]
    assert "TapeGraphs here" in output  # the CPU's figures, said so


def test_plan_json_holds_a_figure_per_size_the_traffic_the_rows_the_frontier_and_the_exports(planned):
    _, _, doc = planned
    assert [f["batch"] for f in doc["per_size"]] == list(range(1, len(doc["per_size"]) + 1))
    assert len(doc["per_size"]) >= 6  # every size up to the traffic's largest, at least
    for f in doc["per_size"]:
        assert {"batch", "eager_ms", "graph_ms", "graph_bytes", "capture_s", "measured"} <= set(f)
    assert doc["traffic"] == TRAFFIC
    for row in (doc["chosen"], *doc["baselines"]):
        assert {"sizes", "expected_ms", "padding_share", "eager_share", "graph_bytes", "capture_s"} <= set(row)
    assert doc["format"] == "graphrt-plan/4" and doc["timing"]["rounds"] == 4
    for f in doc["per_size"]:  # measured sizes carry their rounds, interpolated ones none
        assert bool(f["eager_rounds_ms"] and f["graph_rounds_ms"]) == f["measured"]
    for row in doc["baselines"]:  # each with its uncertainty
        vs = row["vs_chosen"]
        assert vs["interval"][0] <= vs["ratio"] <= vs["interval"][1]
        assert vs["measurable"] == (not vs["interval"][0] <= 0 <= vs["interval"][1])
    assert set(doc["verdict"]) == {"noisy", "chosen_reach", "level", "rounds", "said"}
    assert [f["graphs"] for f in doc["frontier"]] == [1, 2, 3]
    assert set(doc["export"]) == {"vllm", "sglang", "tensorrt_llm", "graphrt"}
    assert doc["export"]["graphrt"]["buckets"] == doc["chosen"]["sizes"]


def test_the_chosen_sizes_are_the_exact_optimum_of_the_figures_the_plan_measured(planned):
    _, _, doc = planned
    figures = [SizeFigures(**f) for f in doc["per_size"]]
    problem = problem_for(figures, {int(b): n for b, n in doc["traffic"].items()})
    best = min((evaluate(problem, sizes) for k in (1, 2, 3)
                for sizes in combinations(range(1, problem.size + 1), k)), key=lambda plan: plan.key)
    assert doc["chosen"]["sizes"] == list(best.sizes)
    assert doc["chosen"]["expected_ms"] == pytest.approx(best.mean_ms)


def test_the_plan_run_on_a_sample_costs_what_its_sizes_cost_re_timed_alone_beside_it(planned):
    _, output, doc = planned
    check = doc["check"]
    for mean in ("measured", "retimed", "predicted"):
        low, high = check[mean]["band_ms"]
        assert low <= check[mean]["ms"] <= high, mean
    (m_low, m_high), (r_low, r_high) = check["measured"]["band_ms"], check["retimed"]["band_ms"]
    assert check["agrees"] and m_low <= r_high and r_low <= m_high  # the spreads overlap
    assert "agree within the timing's spread" in output
    assert check["measured_bytes"] == check["predicted_bytes"] == doc["chosen"]["graph_bytes"]  # a tape's own


def test_measurements_of_an_earlier_plan_are_reused_without_measuring(planned, tmp_path):
    where, _, doc = planned
    result = CliRunner().invoke(main, ["plan", *FAST, "--traffic", str(where / "traffic.json"), "--max-graphs", "2",
                                       "--measurements", str(where / "out.json"), "--no-verify",
                                       "--json", str(tmp_path / "again.json")])
    assert result.exit_code == 0, result.output
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["per_size"] == doc["per_size"]
    best_of_two = min(doc["frontier"][:2], key=lambda f: f["expected_ms"])  # the same figures
    assert (again["chosen"]["sizes"], again["chosen"]["expected_ms"]) == (best_of_two["sizes"], best_of_two["expected_ms"])


def test_the_engines_lists_are_resolved_from_the_settings_passed_and_the_device_served_on(planned, tmp_path):
    # a vLLM server of 256 sequences and 300 batched tokens, and SGLang on an 80 GB device: their
    # lists end at 300 and at 256, whatever the traffic's largest batch (6 here)
    where, _, _ = planned
    result = CliRunner().invoke(main, ["plan", *FAST, "--traffic", str(where / "traffic.json"), "--no-verify",
                                       "--measurements", str(where / "out.json"), "--device-memory", "80",
                                       "--engine-setting", "vllm.max_num_seqs=256",
                                       "--engine-setting", "vllm.max_num_batched_tokens=300",
                                       "--json", str(tmp_path / "engines.json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "engines.json").read_text())
    vllm, sglang, trtllm = doc["engines"]
    assert (vllm["sizes"][-1], vllm["full_graphs_up_to"], sglang["sizes"][-1], trtllm["sizes"][-1]) == (300, 256, 256, 128)
    assert doc["served_on"]["said"] == "80 GiB (--device-memory)"
    assert "served on 80 GiB (--device-memory):" in result.stdout
    assert "vLLM (0.30.0): max_num_seqs 256, max_num_batched_tokens 300, max_model_len" in result.stdout
    assert ",272,288,300 (38 sizes); decode replays full graphs up to 256" in result.stdout
    assert ",240,248,256 (36 sizes)" in result.stdout


def test_a_bad_engine_setting_is_refused_before_anything_runs(tmp_path):
    (tmp_path / "traffic.json").write_text(json.dumps(TRAFFIC))
    result = CliRunner().invoke(main, ["plan", *FAST, "--traffic", str(tmp_path / "traffic.json"),
                                       "--engine-setting", "sglang.max_running_requests=many"])
    assert result.exit_code == 1
    assert result.output.strip() == ("error: --engine-setting sglang.max_running_requests=many: "
                                     "expected a positive integer")


@pytest.mark.slow
def test_measurements_of_another_model_are_refused(planned):
    where, _, _ = planned
    result = CliRunner().invoke(main, ["plan", "--model", "qwen2-0.5b", "--traffic", str(where / "traffic.json"),
                                       "--measurements", str(where / "out.json"), "--no-verify"])
    assert result.exit_code == 1
    assert "measured tiny · cpu · float32, this plan is for qwen2-0.5b" in result.output


def test_a_bad_traffic_entry_is_one_line_naming_the_file_and_the_entry(tmp_path):
    (tmp_path / "bad.csv").write_text("batch,count\n1,4\n2,-1\n")
    result = CliRunner().invoke(main, ["plan", *FAST, "--traffic", str(tmp_path / "bad.csv")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'bad.csv'}: line 3: count '-1' for batch 2 is not a non-negative integer")


def test_a_budget_no_plan_fits_is_refused_with_what_the_smallest_plan_needs(planned):
    where, _, _ = planned
    result = CliRunner().invoke(main, ["plan", *FAST, "--traffic", str(where / "traffic.json"), "--memory", "0.00001",
                                       "--measurements", str(where / "out.json"), "--no-verify"])
    assert result.exit_code == 1
    assert "error: no plan fits --memory 1e-05: the smallest plan, one graph, needs" in result.output


def test_plot_writes_a_png_of_the_frontier(planned, tmp_path):
    pytest.importorskip("matplotlib")
    where, _, _ = planned
    result = CliRunner().invoke(main, ["plan", *FAST, "--traffic", str(where / "traffic.json"),
                                       "--measurements", str(where / "out.json"), "--no-verify",
                                       "--plot", str(tmp_path / "f.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sizes_between_measured_ones_are_interpolated_and_say_so():
    point = dict(eager_p10=0.0, eager_p90=0.0, graph_p10=0.0, graph_p90=0.0, capture_s=0.0, first_capture_s=0.0)
    measured = {1: SizeFigures(1, 1.0, graph_ms=0.5, graph_bytes=100, first_graph_bytes=100, measured=True, **point),
                4: SizeFigures(4, 4.0, graph_ms=2.0, graph_bytes=400, first_graph_bytes=700, measured=True, **point)}
    sizes = interpolate(measured, 4)
    assert [f.measured for f in sizes] == [True, False, False, True]
    assert (sizes[1].eager_ms, sizes[1].graph_ms, sizes[1].graph_bytes, sizes[1].first_graph_bytes) == (2.0, 1.0, 200, 300)


def _rewritten(where, tmp_path, name: str, change) -> str:
    """The shared plan's JSON with `change(doc)` applied, as --measurements of another run."""
    doc = json.loads((where / "out.json").read_text())
    change(doc)
    (tmp_path / name).write_text(json.dumps(doc))
    return str(tmp_path / name)


def test_measurements_whose_rounds_vary_widely_give_no_verdict_but_say_the_machine_is_too_noisy(planned, tmp_path):
    # the same figures, as if each round had run anywhere from 40 % faster to 40 % slower
    def busy(doc):
        for f in doc["per_size"]:
            for mode in ("eager", "graph"):
                f[f"{mode}_rounds_ms"] = [ms * s for ms, s in zip(f[f"{mode}_rounds_ms"], cycle((0.6, 1.4, 1.0, 0.8)))]

    where, _, _ = planned
    result = CliRunner().invoke(main, ["plan", *FAST, "--traffic", str(where / "traffic.json"), "--no-verify",
                                       "--measurements", _rewritten(where, tmp_path, "busy.json", busy),
                                       "--json", str(tmp_path / "plan.json")])
    assert result.exit_code == 0, result.output
    assert "no verdict: the machine is too noisy to choose: the chosen plan's mean step is known only to ±" in result.output
    assert "or more" in result.output and "--rounds " in result.output
    assert "the chosen sizes, as each engine takes them" not in result.output  # no sizes to use
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["verdict"]["noisy"]
    table = result.output.split("no verdict")[0]
    assert table.count("too noisy") == len(doc["baselines"])  # no row ranked
    assert "note: all eager beats" not in result.output


def test_measurements_of_a_plan_made_before_rounds_are_used_and_their_uncertainty_said_unknown(planned, tmp_path):
    def before_rounds(doc):
        doc["format"] = "graphrt-plan/3"
        for f in doc["per_size"]:
            for field in ("eager_rounds_ms", "graph_rounds_ms", "eager_outliers_ms", "graph_outliers_ms"):
                del f[field]

    where, _, _ = planned
    result = CliRunner().invoke(main, ["plan", *FAST, "--traffic", str(where / "traffic.json"), "--no-verify",
                                       "--measurements", _rewritten(where, tmp_path, "old.json", before_rounds)])
    assert result.exit_code == 0, result.output
    assert "note: the per-size figures carry no rounds (a plan made before them)" in result.output
    assert "unknown" in result.output.split("frontier")[0]
