"""A count a marker states past any batch is named by the field that states it, in each engine's
own words, so that the note for a marker that marks no step says which of its numbers is wrong
(graphrt.engines.step_marker.PastBound)."""

from __future__ import annotations

import pytest

from graphrt.engines import atom, tensorrt_llm, vllm
from graphrt.engines.step_marker import COUNT_BOUND, PastBound

BIG = str(COUNT_BOUND)  # the first count no engine writes
SQ = "sk1sqsq1sqsk1"  # the rest of a detailed vLLM request group: sq (its tokens), sk, sqsq, sqsk


@pytest.mark.parametrize("read, name, field", [
    (vllm.read_marker, f"execute_context_{BIG}(1)_generation_1(1)", "context"),
    (vllm.read_marker, f"execute_context_1({BIG})_generation_1(1)", "context tokens"),
    (vllm.read_marker, f"execute_context_1(1)_generation_{BIG}(1)", "generation"),
    (vllm.read_marker, f"execute_context_1(1)_generation_1({BIG})", "generation tokens"),
    (vllm.read_marker, f"execute_{BIG}_context_1(sq1{SQ})_generation_1(sq1{SQ})", "tokens"),
    (vllm.read_marker, f"execute_2_context_{BIG}(sq1{SQ})_generation_1(sq1{SQ})", "context"),
    (vllm.read_marker, f"execute_2_context_1(sq{BIG}{SQ})_generation_1(sq1{SQ})", "sq"),
    (vllm.read_marker, f"execute_2_context_1(sq1{SQ})_generation_{BIG}(sq1{SQ})", "generation"),
    (vllm.read_marker, f"execute_2_context_1(sq1{SQ})_generation_1(sq{BIG}{SQ})", "sq"),
    (vllm.read_marker, f"execute_new_{BIG}_cached_0", "new"),
    (vllm.read_marker, f"execute_new_0_cached_{BIG}", "cached"),
    (tensorrt_llm.read_marker, f"_forward_step 3: {BIG} ctx reqs, 1 gen reqs", "ctx reqs"),
    (tensorrt_llm.read_marker, f"_forward_step 3: 1 ctx reqs, {BIG} gen reqs", "gen reqs"),
    (atom.read_marker, f"decode[bs={BIG}]", "bs"),
    (atom.read_marker, f"decode[bs=2/{BIG}]", "bs"),
    (atom.read_marker, f"prefill[bs=2 tok={BIG}]", "tok"),
    (atom.read_marker, f"decode[bs=2 p={BIG}]", "p"),
])
def test_a_count_past_any_batch_is_named_by_the_field_that_states_it(read, name, field):
    with pytest.raises(PastBound) as past:
        read(name)
    assert (past.value.field, past.value.digits) == (field, BIG)


def test_the_same_markers_with_counts_below_the_bound_read():
    assert vllm.read_marker(f"execute_2_context_1(sq1{SQ})_generation_1(sq1{SQ})").tokens == 2
    assert tensorrt_llm.read_marker("_forward_step 3: 1 ctx reqs, 2 gen reqs").requests == 3
    assert (atom.read_marker("decode[bs=2/4 tok=2]").requests, atom.read_marker("decode[bs=2/4]").padded_to) == (2, 4)
