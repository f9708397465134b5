"""The engines' registry (graphrt.engines): each engine's module is the one place that reads its
markers, names them in a note, and, where graphrt knows its capture list, resolves and exports it."""

import pytest

from graphrt.engines.registry import BY_KEY, ENGINES
from graphrt.plan.engine_lists import exports, parse_settings
from graphrt.trace.analysis.markers import MARKERS, unread

# a marker of each form each engine writes, as its source writes it
WRITTEN = {
    "vLLM": ["execute_context_0(0)_generation_32(32)", "execute_new_4_cached_0",
             "execute_6147_context_2(sq6144sk7144sqsq20971520sqsk23019520)_generation_3(sq3sk6144sqsq3sqsk6144)"],
    "SGLang": ["step[DECODE bs=64]", "step[DRAFT_LOOP raw_bs=3 bs=4 topk=1]"],
    "ATOM": ["prefill[bs=2 tok=14721 ctx=[7803, 6918]]", "decode[bs=117/128 tok=117 d=117]"],
    "TensorRT-LLM": ["_forward_step: 1 ctx reqs, 7 gen reqs", "[Executor] _forward_step 42: 1 ctx reqs, 7 gen reqs"],
}


def test_every_engine_is_registered_once_with_markers_of_its_own():
    assert [engine.name for engine in ENGINES] == list(WRITTEN)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda engine: engine.name)
def test_an_engines_markers_are_read_by_its_module_alone_and_begin_as_it_says(engine):
    for name in WRITTEN[engine.name]:
        readers = [other.name for other in ENGINES if other.read_marker(name) is not None]
        assert readers == [engine.name], name
        assert engine.read_marker(name).engine == engine.name
        assert engine.begins.match(name), name  # so a broken one of its markers is named with its forms


@pytest.mark.parametrize("engine", ENGINES, ids=lambda engine: engine.name)
def test_a_note_names_every_engine_and_a_broken_marker_the_forms_of_its_engine(engine):
    assert f"{engine.name}'s" in MARKERS
    broken = WRITTEN[engine.name][0][:-1] + "x"  # its last character spoilt: no longer one of its forms
    assert [found.expected for found in unread([broken])] == [engine.forms]


def test_every_engine_with_a_setting_name_resolves_and_exports_a_list_and_only_those_are_settable():
    assert set(parse_settings([])) == set(BY_KEY) == {"vllm", "sglang", "tensorrt_llm"}
    for key, engine in BY_KEY.items():
        assert engine.settings and engine.resolve is not None and engine.export is not None, key
    assert list(exports((1, 2))) == [*BY_KEY, "graphrt"]
