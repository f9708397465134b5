"""The engines' capture lists as their servers resolve them, each rule on the cases of its source
and on both sides of every tier and cap; the settings a user passes; and the exports."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest

from graphrt.backends.choices import parse_buckets
from graphrt.engines import sglang, tensorrt_llm, vllm
from graphrt.engines.engine import ServedOn
from graphrt.plan.engine_lists import engine_lists, exports, parse_settings
from graphrt.plan.planner import _engine_record, formed
from graphrt.errors import GraphrtError

GIB = 1 << 30
H100 = ServedOn(80 * GIB, "NVIDIA H100 80GB HBM3", blackwell=False)
L40 = ServedOn(48 * GIB, "NVIDIA L40S", blackwell=False)
B200 = ServedOn(180 * GIB, "NVIDIA B200", blackwell=True)


# -- vLLM 0.30.0 --------------------------------------------------------------------------------

@pytest.mark.parametrize("memory, name, defaults", [
    (160 * GIB, "NVIDIA B200", (16384, 1024)),
    (160 * GIB - 1, "NVIDIA H200", (8192, 1024)),
    (70 * GIB, "NVIDIA H100 80GB HBM3", (8192, 1024)),
    (80 * GIB, "NVIDIA A100-SXM4-80GB", (2048, 256)),  # an A100 keeps the smaller defaults
    (70 * GIB - 1, "NVIDIA H100", (2048, 256)),
])
def test_vllm_serves_with_batch_defaults_by_the_devices_memory_and_name(memory, name, defaults):
    assert vllm.batch_defaults(memory, name) == defaults  # (max_num_batched_tokens, max_num_seqs)


def test_vllm_captures_1_2_4_then_steps_of_8_below_256_then_16_up_to_twice_max_num_seqs():
    assert vllm.capture_sizes(1, 8192) == (1, 2)  # largest min(2 * 1, 512) = 2
    assert vllm.capture_sizes(4, 8192) == (1, 2, 4, 8)
    assert vllm.capture_sizes(12, 8192) == (1, 2, 4, 8, 16, 24)
    assert vllm.capture_sizes(128, 8192)[-2:] == (248, 256)  # a largest size of 256 is captured
    assert vllm.capture_sizes(256, 8192) == (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))


def test_vllm_caps_its_largest_size_at_512_and_at_1024_on_data_center_blackwell():
    assert vllm.capture_sizes(1024, 8192)[-1] == vllm.capture_sizes(257, 8192)[-1] == 512
    assert vllm.capture_sizes(255, 8192)[-1] == 510 - 510 % 16  # below the cap: 2 * 255 on the grid
    assert vllm.capture_sizes(1024, 8192, blackwell=True)[-1] == 1024
    assert vllm.capture_sizes(256, 8192, blackwell=True) == vllm.capture_sizes(256, 8192)  # 512 either way


def test_vllm_cuts_its_list_at_max_num_batched_tokens_and_appends_it_where_it_is_off_the_grid():
    assert vllm.capture_sizes(256, 300)[-4:] == (256, 272, 288, 300)
    assert vllm.capture_sizes(256, 288)[-2:] == (272, 288)  # on the grid: not twice
    assert vllm.capture_sizes(256, 5)[-3:] == (2, 4, 5)
    assert vllm.capture_sizes(4, 100) == (1, 2, 4, 8)  # above the largest size: not appended
    assert vllm.capture_sizes(4, 8) == (1, 2, 4, 8)


def test_vllm_captures_every_size_to_32_in_the_interactivity_performance_mode():
    sizes = vllm.capture_sizes(256, 8192, interactivity=True)
    assert sizes[:33] == (*range(1, 33), 40) and sizes[-1] == 512
    assert vllm.capture_sizes(3, 8192, interactivity=True) == (1, 2, 3, 4, 5, 6)  # up to 2 * 3


def test_vllm_serve_on_an_h100_resolves_1024_sequences_8192_tokens_and_a_list_to_512():
    listed = vllm.capture_list({}, H100, max_model_len=32768)
    assert listed.assumed == {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "max_model_len": 32768,
                              "performance_mode": "balanced", "cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert listed.sizes[-1] == 512 and listed.full_graphs_up_to == 1024 and listed.decode_sizes() == listed.sizes


def test_vllm_with_256_sequences_and_300_batched_tokens_ends_its_list_at_300_and_its_full_graphs_at_256():
    listed = vllm.capture_list({"max_num_seqs": 256, "max_num_batched_tokens": 300}, H100, max_model_len=32768)
    assert listed.sizes[-1] == 300 and listed.decode_sizes()[-1] == 256


def test_vllm_defaults_are_doubled_in_throughput_mode_and_bounded_by_each_other_and_the_model_length():
    assert vllm.capture_list({"performance_mode": "throughput"}, H100, 32768).assumed["max_num_seqs"] == 2048
    assert vllm.capture_list({"performance_mode": "throughput", "max_num_seqs": 8}, H100, 32768).assumed[
        "max_num_batched_tokens"] == 16384  # only what was not given is doubled
    # an unset max_num_seqs is at most max_num_batched_tokens, an unset token budget at most
    # max_num_seqs * max_model_len
    assert vllm.capture_list({"max_num_batched_tokens": 300}, H100, 32768).assumed["max_num_seqs"] == 300
    assert vllm.capture_list({"max_num_seqs": 300}, H100, 32768).assumed["max_num_batched_tokens"] == 8192
    tight = vllm.capture_list({}, L40, max_model_len=4).assumed
    assert (tight["max_num_batched_tokens"], tight["max_num_seqs"]) == (256 * 4, 256)


def test_vllm_refuses_max_num_batched_tokens_below_max_num_seqs_naming_both():
    with pytest.raises(GraphrtError) as refused:
        vllm.capture_list({"max_num_seqs": 256, "max_num_batched_tokens": 100}, H100, 32768)
    assert str(refused.value) == (
        "--engine-setting: vLLM refuses max_num_batched_tokens 100 below max_num_seqs 256 (max_num_batched_tokens "
        "given, max_num_seqs given); expected vllm.max_num_batched_tokens of at least 256")
    with pytest.raises(GraphrtError, match=r"max_num_batched_tokens 8192 below max_num_seqs 9000 \("
                                           r"max_num_batched_tokens by default, max_num_seqs given\)"):
        vllm.capture_list({"max_num_seqs": 9000}, H100, 32768)
    assert vllm.capture_list({"max_num_seqs": 256, "max_num_batched_tokens": 256}, H100, 32768).sizes[-1] == 256  # equal: served


def test_vllm_speculative_decoding_scales_the_cap_by_1_plus_k_and_adds_sizes_in_multiples_of_it():
    plain, drafted = vllm.capture_sizes(4, 8192), vllm.capture_sizes(4, 8192, query_len=3)
    assert plain == (1, 2, 4, 8)  # largest 2 * 4
    # largest 2 * 4 * 3 = 24; the grid to 24, and 3 times the request counts 1, 2, 4
    assert drafted == (1, 2, 3, 4, 6, 8, 12, 16, 24)
    big = vllm.capture_sizes(256, 8192, query_len=4)  # the cap: min(2 * 256 * 4, 512)
    assert big[-1] == 512 and {4 * n for n in (1, 2, 4, 8, 16, 24, 64, 120, 128)} <= set(big)
    assert 4 * 136 not in big  # above the cap: left to eager
    assert vllm.capture_sizes(4, 10, query_len=3)[-3:] == (6, 8, 10)  # cut at max_num_batched_tokens


def test_vllm_decode_batches_replay_full_graphs_at_sizes_rounded_up_to_multiples_of_1_plus_k():
    sizes = vllm.capture_sizes(4, 8192, query_len=3)  # 1, 2, 3, 4, 6, 8, 12, 16, 24
    # each size rounded up to a multiple of 3, in requests, at most max_num_seqs 4
    assert vllm.decode_requests(sizes, 4, 3) == (1, 2, 3, 4)
    assert vllm.decode_requests((1, 2, 4, 8, 16, 24), 12) == (1, 2, 4, 8)  # one token a request
    listed = vllm.capture_list({"max_num_seqs": 4, "speculative_config.num_speculative_tokens": 2}, H100, 32768)
    assert listed.sizes == sizes and listed.decode_sizes() == (1, 2, 3, 4) and listed.speculative
    assert listed.assumed["speculative_config.num_speculative_tokens"] == 2
    assert "verifies draft tokens too" in _engine_record(listed, {3: 1})["note"]


def test_decode_batches_vllm_would_run_in_piecewise_graphs_are_named_as_charged_eager_not_hidden():
    listed = vllm.capture_list({"max_num_seqs": 12}, H100, 32768)  # 1, 2, 4, 8, 16, 24: full graphs to 8
    assert listed.sizes == (1, 2, 4, 8, 16, 24) and listed.decode_sizes() == (1, 2, 4, 8)
    traffic = {3: 5, 10: 3}  # 10 pads to 16, a size above max_num_seqs: piecewise
    assert _engine_record(listed, traffic)["note"] == (
        "its decode batches 10..10 replay piecewise graphs (FULL_AND_PIECEWISE), which plan does not measure: "
        "charged as eager steps, an upper bound")
    eager_above = vllm.capture_list({"max_num_seqs": 12, "cudagraph_mode": "FULL_DECODE_ONLY"}, H100, 32768)
    assert _engine_record(eager_above, traffic)["note"] is None  # they do run eagerly there
    assert _engine_record(listed, {3: 5, 8: 1})["note"] is None


def test_vllm_forms_no_decode_batch_above_max_num_seqs_so_none_is_charged_or_called_piecewise_there():
    listed = vllm.capture_list({"max_num_seqs": 12, "cudagraph_mode": "FULL_DECODE_ONLY"}, H100, 32768)
    # a step of 30 requests runs as 12 + 12 + 6, one of 20 as 12 + 8
    assert formed({3: 5, 20: 1, 30: 2}, listed.full_graphs_up_to) == {3: 5, 12: 5, 8: 1, 6: 2}
    assert formed({3: 5, 12: 1}, 12) == {3: 5, 12: 1} and formed({40: 1}, None) == {40: 1}
    note = _engine_record(listed, {3: 5, 20: 1, 30: 2})["note"]
    assert note == ("its traffic's batches 20..30 (3 steps) are above max_num_seqs 12, a decode batch it never forms: "
                    "charged as the 8 steps of at most 12 its scheduler runs them as, the mean per traffic step")
    assert "piecewise" not in note


def test_a_vllm_row_charges_each_traffic_step_the_steps_its_scheduler_splits_it_into():
    from graphrt.plan.measure_sizes import SizeFigures
    from graphrt.plan.planner import _baseline

    # every step costs 1 ms eager and 0.5 ms as a graph, whatever its batch. Under max_num_seqs 12
    # (full graphs 1, 2, 4, 8) a step of 30 requests runs as 12 (eager: it pads to 16, above
    # max_num_seqs), 12 (eager) and 6 (the graph of 8): 2.5 ms; a step of 2, 0.5 ms
    figures = [SizeFigures(b, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0, 0.0, 0, 0.0, True) for b in range(1, 31)]
    listed = vllm.capture_list({"max_num_seqs": 12, "cudagraph_mode": "FULL_DECODE_ONLY"}, H100, 32768)
    row = _baseline(figures, {30: 1, 2: 1}, listed)
    assert row.plan.steps == 2 and row.plan.mean_ms == pytest.approx((2.5 + 0.5) / 2)
    assert row.plan.eager_steps / row.plan.steps == 2 / 4  # two of the four steps the server runs


# -- SGLang 0.5.23 ------------------------------------------------------------------------------

@pytest.mark.parametrize("gib, tp, max_bs", [
    (20 - 1e-3, 1, 8), (20, 1, 48), (20, 4, 160), (35 - 1e-3, 1, 48), (35, 1, 32), (35, 4, 160),
    (60 - 1e-3, 1, 32), (60, 1, 256), (60, 4, 512), (80, 1, 256), (90, 1, 256), (160 - 1e-3, 4, 512),
    (160, 1, 512),
])
def test_sglang_takes_its_decode_max_batch_from_the_devices_memory_tier_and_tp(gib, tp, max_bs):
    assert sglang.decode_max_bs(round(gib * GIB), tp) == max_bs


def test_sglang_captures_1_2_4_8_12_then_steps_of_8_16_and_32_cut_at_max_bs_and_max_bs():
    assert sglang.capture_sizes(8) == (1, 2, 4, 8)
    assert sglang.capture_sizes(10) == (1, 2, 4, 8, 10)  # the max appended
    assert sglang.capture_sizes(30) == (1, 2, 4, 8, 12, 16, 24, 30)
    assert sglang.capture_sizes(545)[-3:] == (512, 544, 545)
    assert sglang.capture_sizes(600) == (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), 512, 544, 576, 600)
    assert sglang.capture_sizes(5, padding=False) == (1, 2, 3, 4, 5)  # padding disabled: every size


def test_sglang_on_80_gb_ends_at_256_and_max_running_requests_cuts_a_default_max_batch():
    assert sglang.capture_list({}, H100).sizes[-1] == 256
    assert sglang.capture_list({"max_running_requests": 64}, H100).sizes[-1] == 64
    assert sglang.capture_list({"max_running_requests": 300}, H100).sizes[-1] == 256  # not raised
    assert sglang.capture_list({"tp_size": 4}, H100).sizes[-1] == 512
    assert sglang.capture_list({"disable_cuda_graph_padding": True}, L40).sizes == tuple(range(1, 33))


def test_sglang_always_clamps_its_list_to_the_request_pool_of_max_running_requests():
    # the case: 512 asked for, a pool of 100: the sizes below 100, and 100 itself
    listed = sglang.capture_list({"cuda_graph_max_bs_decode": 512, "max_running_requests": 100}, H100)
    assert listed.sizes == (1, 2, 4, 8, 12, *range(16, 97, 8), 100) and len(listed.sizes) == 17
    assert sglang.capture_list({"cuda_graph_max_bs_decode": 100, "max_running_requests": 64}, H100).sizes[-2:] == (56, 64)
    assert sglang.pool_clamp((1, 2, 4, 8), 8) == (1, 2, 4, 8)  # a pool that holds the list: as it is
    assert sglang.pool_clamp((1, 2, 4, 8), 3) == (1, 2, 3)
    assert listed.assumed["max_running_requests"] == 100


def test_sglang_speculative_decoding_captures_its_own_list_in_a_pool_of_48_unless_given():
    assert sglang.capture_sizes(100, speculative=True) == (
        *range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 97, 8), 100)
    assert sglang.capture_sizes(300, speculative=True)[-3:] == (272, 288, 300)
    assert sglang.capture_sizes(5, padding=False, speculative=True) == (1, 2, 3, 4, 5)  # padding off comes first
    eagle = sglang.capture_list({"speculative_algorithm": "EAGLE"}, H100)  # 256 by the tier, then the pool of 48
    assert eagle.sizes == (*range(1, 9), *range(10, 33, 2), 40, 44, 48) and eagle.speculative
    assert eagle.assumed["max_running_requests"] == 48
    given = sglang.capture_list({"speculative_algorithm": "NGRAM", "max_running_requests": 200}, H100)
    assert given.sizes[-3:] == (184, 192, 200)
    uno = sglang.capture_list({"speculative_algorithm": "UNO"}, H100)  # UNO leaves the pool to the KV cache
    assert uno.sizes[-1] == 256 and "max_running_requests" not in uno.assumed


def test_sglang_captures_up_to_a_decode_max_batch_given_past_its_memory_tier():
    listed = sglang.capture_list({"cuda_graph_max_bs_decode": 400}, H100)  # the tier alone would stop at 256
    assert listed.sizes[-2:] == (384, 400) and listed.padding and listed.name == sglang.LISTED


def test_sglang_says_each_setting_its_list_depends_on_as_it_resolved_it():
    assert sglang.capture_list({}, H100).assumed == {
        "tp_size": 1, "cuda_graph_max_bs_decode": 256, "disable_cuda_graph_padding": False}
    # a smaller request pool cuts the decode max batch itself, not only the list
    assert sglang.capture_list({"max_running_requests": 64, "disable_cuda_graph_padding": True}, L40).assumed == {
        "tp_size": 1, "cuda_graph_max_bs_decode": 32, "disable_cuda_graph_padding": True, "max_running_requests": 64}
    assert sglang.capture_list({"max_running_requests": 64}, H100).assumed["cuda_graph_max_bs_decode"] == 64
    assert sglang.capture_list({"speculative_algorithm": "EAGLE", "tp_size": 4}, H100).assumed == {
        "tp_size": 4, "cuda_graph_max_bs_decode": 512, "disable_cuda_graph_padding": False,
        "speculative_algorithm": "EAGLE", "max_running_requests": 48}


# -- TensorRT-LLM -------------------------------------------------------------------------------

def test_tensorrt_llm_1_0_captures_1_to_31_32_64_128_then_powers_of_two_and_the_max_itself():
    assert tensorrt_llm.capture_sizes() == (*range(1, 32), 32, 64, 128)  # cuda_graph_config unset: 128
    assert tensorrt_llm.capture_sizes(20) == (*range(1, 21),)
    assert tensorrt_llm.capture_sizes(40) == (*range(1, 32), 32, 40)  # the max appended
    assert tensorrt_llm.capture_sizes(600) == (*range(1, 32), 32, 64, 128, 256, 512, 600)
    assert tensorrt_llm.capture_sizes(128, enable_padding=True) == (1, 2, 4, *range(8, 129, 8))
    assert tensorrt_llm.capture_sizes(256, enable_padding=True) == (1, 2, 4, *range(8, 129, 8), 256)


def test_the_newer_tensorrt_llm_pads_in_steps_of_64_after_128_and_otherwise_captures_as_1_0():
    assert tensorrt_llm.capture_sizes(256, True, newer=True) == (1, 2, 4, *range(8, 129, 8), 192, 256)
    assert tensorrt_llm.capture_sizes(300, True, newer=True)[-3:] == (192, 256, 300)
    assert tensorrt_llm.capture_sizes(128, True, newer=True) == tensorrt_llm.capture_sizes(128, True)
    assert tensorrt_llm.capture_sizes(600, False, newer=True) == tensorrt_llm.capture_sizes(600, False)


def test_the_tensorrt_llm_executor_cuts_the_list_at_its_max_batch_and_tokens_and_pads_to_that_batch():
    unpadded, padded = tensorrt_llm.capture_sizes(128), tensorrt_llm.capture_sizes(128, True)
    assert tensorrt_llm.executor_cut(unpadded, 48, 8192, False) == (*range(1, 32), 32)
    assert tensorrt_llm.executor_cut(padded, 48, 8192, True)[-2:] == (40, 48)  # on the list: once
    assert tensorrt_llm.executor_cut(padded, 50, 8192, True)[-2:] == (48, 50)  # the batch padded to
    assert tensorrt_llm.executor_cut(unpadded, 2048, 20, False) == tuple(range(1, 21))
    assert tensorrt_llm.executor_cut(padded, 2048, 8192, True) == padded


def test_tensorrt_llm_lists_one_row_where_its_versions_agree_and_two_where_padding_differs():
    (default,) = tensorrt_llm.capture_lists({})
    assert default.name == tensorrt_llm.LISTED and default.sizes[-1] == 128 and not default.padding
    both = tensorrt_llm.capture_lists({"cuda_graph_config.enable_padding": True, "cuda_graph_config.max_batch_size": 256})
    assert [listed.name for listed in both] == [tensorrt_llm.LISTED, tensorrt_llm.LISTED_NEWER]
    assert both[0].sizes[-2:] == (128, 256) and both[1].sizes[-3:] == (128, 192, 256)
    cut = tensorrt_llm.capture_lists({"max_batch_size": 50, "cuda_graph_config.enable_padding": True})
    assert cut[0].sizes[-2:] == (48, 50) and cut[0].assumed["max_batch_size"] == 50


def test_tensorrt_llm_executor_limits_left_unset_are_trtllm_serves_defaults_not_unbounded():
    (default,) = tensorrt_llm.capture_lists({"cuda_graph_config.max_batch_size": 4096})
    assert default.assumed["max_batch_size"] == 2048 and default.assumed["max_num_tokens"] == 8192
    assert default.sizes[-1] == 2048 and 4096 not in default.sizes  # the executor's 2048 cuts the list
    padded = tensorrt_llm.capture_lists({"cuda_graph_config.max_batch_size": 4096, "cuda_graph_config.enable_padding": True})
    assert padded[0].sizes[-1] == 2048  # 4096 replaced by the batch padded to


def test_tensorrt_llm_speculative_decoding_divides_the_tokens_by_one_plus_the_drafts():
    assert tensorrt_llm.executor_cut(tensorrt_llm.capture_sizes(128), 2048, 90, False, max_draft_len=2) == tuple(range(1, 31))
    (drafted,) = tensorrt_llm.capture_lists({"max_num_tokens": 90, "speculative_config.max_draft_len": 2})
    assert drafted.sizes[-1] == 90 // 3 and drafted.speculative
    (plain,) = tensorrt_llm.capture_lists({"max_num_tokens": 90})
    assert plain.sizes[-1] == 64  # 90 one-token requests: the list up to 64
    with pytest.raises(GraphrtError, match=r"^--engine-setting: TensorRT-LLM's max_num_tokens 2 holds no decode "
                                           r"request of 1 \+ max_draft_len 3 tokens; expected "
                                           r"tensorrt_llm.max_num_tokens of at least 4$"):
        tensorrt_llm.capture_lists({"max_num_tokens": 2, "speculative_config.max_draft_len": 3})


def test_tensorrt_llm_says_each_setting_its_lists_depend_on_and_that_padding_is_off_unless_given():
    (default,) = tensorrt_llm.capture_lists({})
    assert default.padding is False and default.assumed == {
        "cuda_graph_config.max_batch_size": 128, "cuda_graph_config.enable_padding": False,
        "max_batch_size": 2048, "max_num_tokens": 8192}
    both = tensorrt_llm.capture_lists({"cuda_graph_config.enable_padding": True, "cuda_graph_config.max_batch_size": 256,
                                       "speculative_config.max_draft_len": 3})
    assert [listed.padding for listed in both] == [True, True]
    assert both[1].assumed == {"cuda_graph_config.max_batch_size": 256, "cuda_graph_config.enable_padding": True,
                               "max_batch_size": 2048, "max_num_tokens": 8192, "speculative_config.max_draft_len": 3}


def test_tensorrt_llm_takes_a_token_budget_of_exactly_one_decode_request():
    (one,) = tensorrt_llm.capture_lists({"max_num_tokens": 4, "speculative_config.max_draft_len": 3})
    assert one.sizes == (1,)


def test_vllm_takes_the_model_length_and_the_token_budget_given_as_they_are():
    listed = vllm.capture_list({"max_model_len": 16}, H100, max_model_len=32768)
    assert listed.assumed["max_model_len"] == 16  # the setting, not the checkpoint's length
    assert listed.assumed["max_num_batched_tokens"] == 8192  # 1024 sequences x 16 positions bound nothing
    given = vllm.capture_list({"max_num_batched_tokens": 100_000, "max_num_seqs": 4}, H100, max_model_len=1024)
    assert given.assumed["max_num_batched_tokens"] == 100_000  # given: not cut to 4 x 1024


def test_vllm_serve_in_the_interactivity_mode_captures_every_size_to_32():
    listed = vllm.capture_list({"performance_mode": "interactivity"}, H100, max_model_len=32768)
    assert listed.sizes[:33] == (*range(1, 33), 40) and listed.assumed["performance_mode"] == "interactivity"


def test_vllm_speculative_decode_batches_count_requests_of_1_plus_k_tokens():
    listed = vllm.capture_list({"max_num_seqs": 64, "speculative_config.num_speculative_tokens": 3}, H100, 32768)
    # each size of tokens replays a decode batch of size / 4 requests: 24 tokens are 6 requests
    assert listed.decode_sizes()[:5] == (1, 2, 4, 6, 8) and listed.decode_sizes()[-1] == 64


def test_a_speculative_setting_is_read_by_each_engine_under_its_own_name():
    # where the limits bind: vLLM's cap of 2 * 100 rises to 512; TensorRT-LLM's 256 tokens hold 64 requests
    limits = ["vllm.max_num_seqs=100", "tensorrt_llm.max_num_tokens=256"]
    settings = parse_settings(["vllm.speculative_config.num_speculative_tokens=3", "sglang.speculative_algorithm=EAGLE3",
                               "tensorrt_llm.speculative_config.max_draft_len=3", *limits])
    lists = engine_lists(settings, H100, 32768)
    assert all(listed.speculative for listed in lists)
    plain = engine_lists(parse_settings(limits), H100, 32768)
    assert all(a.sizes != b.sizes for a, b in zip(lists, plain))  # each list changes
    assert engine_lists(parse_settings(["tensorrt_llm.speculative_config.max_draft_len=3"]), H100, 32768)[-1].sizes == \
        tensorrt_llm.capture_sizes()  # unset, 8192 // 4 holds all of 128
    # at vLLM's defaults on an H100 (1024 sequences) every multiple of 4 requests is on the grid already
    assert engine_lists(parse_settings(["vllm.speculative_config.num_speculative_tokens=3"]), H100, 32768)[0].sizes == \
        vllm.capture_sizes(1024, 8192)
    with pytest.raises(GraphrtError, match="expected one of EAGLE, EAGLE3, NEXTN"):
        parse_settings(["sglang.speculative_algorithm=eagle"])


@pytest.mark.parametrize("device", [H100, L40, B200])
def test_every_resolved_list_is_strictly_increasing_and_positive(device):
    for listed in engine_lists(parse_settings([]), device, max_model_len=32768):
        assert listed.sizes[0] >= 1 and all(a < b for a, b in zip(listed.sizes, listed.sizes[1:])), listed.name


# -- the settings a user passes -----------------------------------------------------------------

def test_settings_are_read_by_engine_and_name_as_each_engine_spells_them():
    settings = parse_settings(["vllm.max_num_seqs=256", "vllm.performance_mode=interactivity",
                               "sglang.disable_cuda_graph_padding=True",
                               "tensorrt_llm.cuda_graph_config.max_batch_size=64"])
    assert settings == {"vllm": {"max_num_seqs": 256, "performance_mode": "interactivity"},
                        "sglang": {"disable_cuda_graph_padding": True},
                        "tensorrt_llm": {"cuda_graph_config.max_batch_size": 64}}


@pytest.mark.parametrize("given, said", [
    ("vllm.max_num_seqs", "--engine-setting vllm.max_num_seqs: expected ENGINE.NAME=VALUE, such as vllm.max_num_seqs=256"),
    ("trtllm.max_batch_size=8", "--engine-setting trtllm.max_batch_size=8: no engine 'trtllm'; expected one of vllm, "
                                "sglang, tensorrt_llm"),
    ("vllm.max_num_seq=8", "--engine-setting vllm.max_num_seq=8: vLLM has no setting 'max_num_seq' that decides its "
                           "capture list; expected one of max_num_seqs, max_num_batched_tokens, max_model_len, "
                           "performance_mode, cudagraph_mode, speculative_config.num_speculative_tokens"),
    ("vllm.max_num_seqs=0", "--engine-setting vllm.max_num_seqs=0: expected a positive integer"),
    ("sglang.disable_cuda_graph_padding=yes", "--engine-setting sglang.disable_cuda_graph_padding=yes: expected true or false"),
    ("vllm.cudagraph_mode=PIECEWISE", "--engine-setting vllm.cudagraph_mode=PIECEWISE: expected one of "
                                      "FULL_AND_PIECEWISE, FULL_DECODE_ONLY"),
])
def test_a_bad_setting_is_refused_in_one_line_naming_it_and_what_was_expected(given, said):
    with pytest.raises(GraphrtError) as refused:
        parse_settings([given])
    assert str(refused.value) == said


def test_a_setting_given_twice_is_refused():
    with pytest.raises(GraphrtError, match=r"^--engine-setting vllm.max_num_seqs=9: vllm.max_num_seqs is given twice$"):
        parse_settings(["vllm.max_num_seqs=8", "vllm.max_num_seqs=9"])


# -- the chosen sizes in each engine's own option ---------------------------------------------------

    assert tensorrt_llm.capture_sizes(128, enable_padding=True) == (1, 2, 4, *range(8, 129, 8))
    assert tensorrt_llm.capture_sizes(256, enable_padding=True) == (1, 2, 4, *range(8, 129, 8), 256)


SIZES = (1, 3, 8, 24)


def test_the_vllm_export_is_the_json_its_compilation_config_option_takes():
    export = exports(SIZES)["vllm"]
    option, value = shlex.split(export["cli"])
    assert option == "--compilation-config"
    assert json.loads(value) == {"cudagraph_capture_sizes": list(SIZES)} == export["compilation_config"]


def test_the_sglang_0_5_23_export_parses_as_its_decode_batch_size_list():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda-graph-bs-decode", type=int, nargs="+")  # as 0.5.23 declares a List[int]
    export = exports(SIZES)["sglang"]
    parsed = parser.parse_args(shlex.split(export["cli"])).cuda_graph_bs_decode
    assert parsed == list(SIZES) == export["cuda_graph_bs_decode"]


def test_the_tensorrt_llm_export_is_yaml_with_padding_on_and_the_chosen_batch_sizes():
    yaml = pytest.importorskip("yaml")  # a test extra (setup.cfg)
    export = exports(SIZES)["tensorrt_llm"]
    parsed = yaml.safe_load(export["yaml"])
    assert parsed == {"cuda_graph_config": {"enable_padding": True, "batch_sizes": list(SIZES)}}
    assert parsed["cuda_graph_config"] == export["cuda_graph_config"]


def test_the_graphrt_export_is_a_buckets_option_graphrt_accepts():
    option, value = exports(SIZES)["graphrt"]["cli"].split()
    assert option == "--buckets" and parse_buckets(value) == SIZES
