"""The name a range is grouped under, and which steps replay (graphrt.trace.analysis.names)."""

import pytest

from graphrt.trace.analysis.names import group_name, is_replay


def test_only_a_replay_range_replays_a_graph():
    assert is_replay("replay[bs=8]")
    assert not any(map(is_replay, ["decode_step[graph]", "ProfilerStep#3", "piece[bs=2,i=0]"]))


@pytest.mark.parametrize("name, group", [
    ("ProfilerStep#12", "ProfilerStep#*"),  # every profiler step is one group
    ("ProfilerStep#12a", "ProfilerStep#12a"),  # not a counter after the #
    ("aten::mm, op_id = 314286", "aten::mm"),
    ("nccl:all_reduce, seq = 12", "nccl:all_reduce"),
    ("aten::mm op_id=7", "aten::mm"),
    ("aten::linear_1", "aten::linear_1"),  # 13 characters then digits, like a profiler step's
    ("seq = 4", "seq = 4"),  # nothing but a counter: grouped under its own name
    ("decode_step[eager]", "decode_step[eager]"),
])
def test_a_range_is_grouped_under_its_name_less_any_per_call_counter(name, group):
    assert group_name(name) == group
