"""What each engine's step marker states, and which ranges count as steps where markers nest
(graphrt.trace.analysis.markers). The marker texts are the engines' own, as their sources write
them (the module docstring names the source and the releases)."""

import pytest

from graphrt.engines.step_marker import ANNOTATION, PROFILER_ITERATION, RUNNER_FUNCTION, Marker
from graphrt.trace.analysis.markers import choose_steps, group_label, parse, step_mode


@pytest.mark.parametrize("name, engine, phase, requests, tokens, padded_to", [
    # vLLM 0.14+: context requests (their tokens), generation requests (theirs)
    ("execute_context_0(0)_generation_32(32)", "vLLM", "decode", 32, 32, None),
    ("execute_context_2(14721)_generation_0(0)", "vLLM", "prefill", 2, 14721, None),
    ("execute_context_1(6144)_generation_3(3)", "vLLM", "mixed", 4, 6147, None),
    ("execute_context_0(0)_generation_0(0)", "vLLM", "idle", 0, 0, None),
    # vLLM 0.26+ detailed: the leading number is every scheduled token
    ("execute_6147_context_2(sq6144sk7144sqsq20971520sqsk23019520)_generation_3(sq3sk6144sqsq3sqsk6144)",
     "vLLM", "mixed", 5, 6147, None),
    # vLLM 0.12-0.13: new and running requests; running ones may still be prefilling
    ("execute_new_4_cached_0", "vLLM", "prefill", 4, None, None),
    ("execute_new_0_cached_30", "vLLM", "unknown", 30, None, None),
    ("execute_new_2_cached_30", "vLLM", "unknown", 32, None, None),
    ("execute_new_0_cached_0", "vLLM", "idle", 0, None, None),
    # SGLang 0.5.11+, with 0.5.19's aggregates and 0.5.20's stage names
    ("step[DECODE bs=64]", "SGLang", "decode", 64, None, None),
    ("step[EXTEND bs=2 toks=14721]", "SGLang", "prefill", 2, 14721, None),
    ("step[EXTEND bs=2 toks=14721 c_sq=14721 c_sqsq=108745533 c_sqsk=108745533 c_sk=14721]",
     "SGLang", "prefill", 2, 14721, None),
    ("step[DECODE bs=64 g_sq=128 g_sqsq=256 g_sqsk=262144 g_sk=131072 forward_id=9]", "SGLang", "decode", 64, 128,
     None),
    ("step[MIXED bs=2]", "SGLang", "mixed", 2, None, None),
    ("step[MIXED bs=2 c=1 g=1 c_sq=5 c_sk=8 c_sqsq=25 c_sqsk=40 g_sq=1 g_sk=12 g_sqsq=1 g_sqsk=12]",
     "SGLang", "mixed", 2, 6, None),
    ("step[MIXED bs=3 c=0 g=3 c_sq=0 c_sk=0 c_sqsq=0 c_sqsk=0 g_sq=3 g_sk=12 g_sqsq=3 g_sqsk=12]",
     "SGLang", "decode", 3, 3, None),
    ("step[IDLE bs=0]", "SGLang", "idle", 0, None, None),
    ("step[TARGET_VERIFY bs=8]", "SGLang", "verify", 8, None, None),
    ("step[VERIFY bs=8]", "SGLang", "verify", 8, None, None),
    ("step[DRAFT bs=8]", "SGLang", "draft", 8, None, None),
    ("step[DRAFT_LOOP raw_bs=3 bs=4 topk=1]", "SGLang", "draft", 3, None, 4),
    ("step[DLLM_EXTEND bs=2]", "SGLang", "unknown", 2, None, None),
    # ATOM: a padded decode states its real rows and its graph's
    ("prefill[bs=2 tok=14721 ctx=[7803, 6918]]", "ATOM", "prefill", 2, 14721, None),
    ("prefill[bs=6 tok=17408 ctx=[4096, 4096, 4096]...+3]", "ATOM", "prefill", 6, 17408, None),
    ("decode[bs=117/128 tok=117 d=117]", "ATOM", "decode", 117, 117, 128),
    ("decode[bs=128 tok=384 p=2 d=126 sqsq=132612 sqsk=1114112 sk=258048 tbo=1]", "ATOM", "mixed", 128, 384, None),
    # TensorRT-LLM's PyTorch backend, its four forms
    ("_forward_step: 0 ctx reqs, 7 gen reqs", "TensorRT-LLM", "decode", 7, None, None),
    ("[Executor] _forward_step: 2 ctx reqs, 0 gen reqs", "TensorRT-LLM", "prefill", 2, None, None),
    ("[Executor] _forward_step 42: 1 ctx reqs, 7 gen reqs", "TensorRT-LLM", "mixed", 8, None, None),
    ("[Executor] _forward_step 42: 1 ctx reqs, 512 ctx tokens, 7 gen reqs", "TensorRT-LLM", "mixed", 8, None, None),
    ("[Executor] _forward_step 43: 0 ctx reqs, 0 ctx tokens, 0 gen reqs", "TensorRT-LLM", "idle", 0, None, None),
    # graphrt's own: a replay states its graph's size, not the live rows
    ("decode_step[eager]", "graphrt", "decode", None, None, None),
    ("replay[bs=8]", "graphrt", "decode", None, None, 8),
    ("decode_step[piecewise,bs=2]", "graphrt", "decode", None, None, 2),
    ("ProfilerStep#1009", "torch.profiler", "unknown", None, None, None),
    ("vllm/v1/worker/gpu_model_runner.py(3380): execute_model", "vLLM", "unknown", None, None, None),
])
def test_a_marker_states_its_engine_phase_and_batch(name, engine, phase, requests, tokens, padded_to):
    m = parse(name)
    assert (m.engine, m.phase, m.requests, m.tokens, m.padded_to) == (engine, phase, requests, tokens, padded_to)
    # the output names each step's marker by its engine; annotations outrank the rest where they nest
    assert m.form.startswith(engine) and (m.tier == ANNOTATION) == (engine not in ("torch.profiler",) and
                                                                  not name.endswith("execute_model"))


@pytest.mark.parametrize("name, mode", [
    ("decode_step[eager]", "eager"), ("decode_step[piecewise,bs=2]", "piecewise"), ("replay[bs=8]", "graph"),
    ("decode_step[compile]", None), ("decode_step[hf]", None), ("step[DECODE bs=2]", None),
])
def test_only_graphrts_own_markers_say_how_the_step_ran(name, mode):
    assert parse(name).mode == mode


@pytest.mark.parametrize("name", [
    "capture_32_DECODE", "capture_8192_PIECEWISE", "## Call CompiledFxGraph abc ##", "copy_in", "capture[bs=8]",
    "model.layers.0 (Qwen2DecoderLayer)", "a decode_step[eager]", "ProfilerStep#12a", "step[decode bs=3]",
    "draft step[DECODE bs=32]", "decode[tok=3]", "execute_context_1(5)", "vllm/v1/worker/gpu_worker.py(1449): execute_model",
    "aten::mm", "_forward_step",
])
def test_other_ranges_mark_no_step(name):
    assert parse(name) is None


def test_the_tiers_put_annotations_before_the_runner_function_before_the_profiler_step():
    tiers = [parse(n).tier for n in ("step[DECODE bs=1]", "vllm/v1/worker/gpu_model_runner.py(1): execute_model",
                                     "ProfilerStep#1")]
    assert tiers == [ANNOTATION, RUNNER_FUNCTION, PROFILER_ITERATION] and sorted(tiers) == tiers


def _choose(ranges: list[tuple[str, int, int, int | None, int]]) -> list[str]:
    """(name, start, end, parent index, tid) per range, all in one process: the names of the steps."""
    names = [r[0] for r in ranges]
    chosen = choose_steps(names, [r[3] for r in ranges], [(1, r[4]) for r in ranges],
                          [r[1] for r in ranges], [r[2] for r in ranges])
    return [names[r] for r, _ in chosen]


def test_nested_markers_make_one_step_of_the_best_tier():
    # vLLM with a profiler schedule: ProfilerStep#N, its annotation inside, its runner's function inside that
    vllm = [("ProfilerStep#1", 0, 100, None, 1), ("execute_context_0(0)_generation_4(4)", 10, 90, 0, 1),
            ("vllm/v1/worker/gpu_model_runner.py(3380): execute_model", 12, 88, 1, 1)]
    assert _choose(vllm) == ["execute_context_0(0)_generation_4(4)"]
    # no annotation (a step vLLM did not annotate): the runner's function, not the profiler step
    assert _choose([vllm[0], (vllm[2][0], 12, 88, 0, 1)]) == [vllm[2][0]]
    assert _choose([vllm[0]]) == ["ProfilerStep#1"]


def test_of_two_nested_annotations_the_inner_one_is_the_step():
    # SGLang's step inside a vLLM-style annotation round the whole batch (as TraceLens's SGLang trace has them)
    assert _choose([("execute_context_0(0)_generation_32(32)", 0, 100, None, 1),
                    ("step[DECODE bs=32]", 5, 95, 0, 1)]) == ["step[DECODE bs=32]"]


def test_an_annotation_inside_a_lower_tier_inside_another_annotation_still_counts_once():
    assert _choose([("execute_context_0(0)_generation_2(2)", 0, 100, None, 1), ("ProfilerStep#1", 1, 99, 0, 1),
                    ("step[DECODE bs=2]", 2, 98, 1, 1)]) == ["step[DECODE bs=2]"]


def test_a_profiler_step_loses_to_a_step_another_thread_began_inside_it():
    ranges = [("ProfilerStep#1", 0, 100, None, 1), ("step[DECODE bs=2]", 10, 50, None, 2),
              ("ProfilerStep#2", 100, 200, None, 1)]
    assert _choose(ranges) == ["step[DECODE bs=2]", "ProfilerStep#2"]


def test_a_profiler_step_loses_only_to_steps_begun_inside_it_by_its_own_process():
    names = ["ProfilerStep#1", "step[DECODE bs=2]", "ProfilerStep#2", "step[DECODE bs=4]", "ProfilerStep#3",
             "step[DECODE bs=8]"]
    threads = [(10, 11), (10, 12), (10, 11), (10, 12), (10, 11), (20, 21)]  # process 10's threads 11, 12; process 20
    starts, ends = [0, 10, 100, 200, 300, 310], [100, 50, 200, 210, 400, 320]
    chosen = choose_steps(names, [None] * len(names), threads, starts, ends)
    # step bs=4 begins the instant ProfilerStep#2 ends: not inside it; step bs=8 is another process's
    assert [names[r] for r, _ in chosen] == ["step[DECODE bs=2]", "ProfilerStep#2", "step[DECODE bs=4]",
                                             "ProfilerStep#3", "step[DECODE bs=8]"]


@pytest.mark.parametrize("name", ["prefill[bs=2 tok=14721 ctx=[7803, 6918]]", "decode[bs=117/128 tok=117 d=117]",
                                  "step[DECODE bs=64]", "replay[bs=8]", "decode_step[eager]", "ProfilerStep#1009"])
def test_the_marker_a_step_came_from_is_named_as_its_engine_spells_it(name):
    spelled = parse(name).form.split(" ", 1)[1]  # after the engine's name
    assert any(name.startswith(form.split("[")[0].split("#")[0]) for form in spelled.split("/"))


def test_sibling_steps_all_count_in_start_order():
    ranges = [("step[DECODE bs=2]", 50, 60, None, 1), ("step[EXTEND bs=1 toks=9]", 0, 40, None, 1),
              ("step[DECODE bs=3]", 70, 80, None, 1)]
    assert _choose(ranges) == ["step[EXTEND bs=1 toks=9]", "step[DECODE bs=2]", "step[DECODE bs=3]"]


def test_a_step_runs_eager_graph_or_piecewise_by_its_graph_launches_where_launches_are_recorded():
    engine, own = parse("step[DECODE bs=2]"), parse("replay[bs=2]")
    assert [step_mode(90, n, True, engine) for n in (0, 1, 2, 81)] == ["eager", "graph", "piecewise", "piecewise"]
    # a trace without launch calls (a CPU's) says nothing: only graphrt's own marker does
    assert (step_mode(0, 0, False, engine), step_mode(0, 0, False, own), step_mode(5, 0, True, own)) == \
        ("unknown", "graph", "eager")


def test_a_step_that_launched_nothing_is_idle_not_eager_whatever_its_marker_says():
    assert [step_mode(0, 0, True, parse(name)) for name in ("step[DECODE bs=2]", "replay[bs=2]", "decode_step[eager]")] \
        == ["idle"] * 3


def test_an_engines_steps_group_by_phase_batch_and_mode():
    assert group_label(parse("step[DECODE bs=32]"), "graph") == "decode bs=32 (graph)"
    assert group_label(parse("execute_new_0_cached_30"), "eager") == "step bs=30 (eager)"
    assert group_label(Marker("vLLM", "f", ANNOTATION, "prefill"), "eager") == "prefill (eager)"
