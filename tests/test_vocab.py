"""The words figures are filed under (graphrt.vocab): a mode or phase is the plain word wherever it
goes, so that typing them changed no table and no JSON, and each is spelled in one place."""

import json

import click

from graphrt.backends.choices import GRAPH_MODES, GROUPS, MODES, expand_modes
from graphrt.cli.trace_command import trace
from graphrt.engines.step_marker import Marker, phase_of
from graphrt.trace.analysis.markers import PHASES, parse, step_mode
from graphrt.vocab import IDLE, STEP_MODES, UNKNOWN, Mode, Phase


def test_a_mode_or_phase_reads_as_its_word_in_text_and_json():
    for word in (*Mode, *Phase):
        assert f"{word}" == str(word) == word.value
        assert json.dumps({word: [word]}) == json.dumps({word.value: [word.value]})
        assert {word.value: 1}[word] == 1  # a key read back from JSON finds the member's figures


def test_the_command_line_modes_are_the_modes_and_its_groups_expand_to_members():
    assert MODES == tuple(Mode) and set(GRAPH_MODES) == {Mode.PIECEWISE, Mode.GRAPH}
    assert expand_modes("all") == MODES
    assert expand_modes("piecewise,eager") == (Mode.PIECEWISE, Mode.EAGER)
    assert all(isinstance(m, Mode) for m in expand_modes("eager,graph"))


def test_graphrt_trace_takes_each_mode_both_records_by_its_word_or_both():
    (option,) = [p for p in trace.params if p.name == "mode"]
    ctx = click.Context(trace)
    words = ("eager", "graph", "both")
    assert [option.type.convert(word, option, ctx) for word in words] == list(words)
    assert {m for choice in option.type.choices for m in expand_modes(choice)} == set(GROUPS["both"])


def test_what_a_marker_does_not_state_is_the_one_unknown():
    assert Marker("x", "x", 1).phase == Phase.UNKNOWN == UNKNOWN == PHASES[-1]
    assert step_mode(0, 0, False, Marker("x", "x", 1)) == UNKNOWN  # launches not recorded, marker silent
    assert UNKNOWN in STEP_MODES and IDLE in STEP_MODES


def test_phases_and_modes_read_from_markers_and_launches_are_members():
    assert phase_of(2, 0) is Phase.PREFILL and phase_of(0, 3) is Phase.DECODE and phase_of(1, 1) is Phase.MIXED
    assert phase_of(0, 0) is Phase.IDLE
    assert parse("decode_step[piecewise,bs=8]").mode is Mode.PIECEWISE
    assert parse("replay[bs=8]").phase is Phase.DECODE
    marker = parse("decode_step[eager]")
    assert [step_mode(n, g, True, marker) for n, g in ((0, 0), (5, 0), (1, 1), (3, 2))] == [
        IDLE, Mode.EAGER, Mode.GRAPH, Mode.PIECEWISE]
