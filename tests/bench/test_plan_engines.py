"""The engines' default capture lists, transcribed from their sources, and the exports."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest

from graphrt.backends.choices import parse_buckets
from graphrt.bench import engines


def test_vllm_000fc94b_default_is_1_2_4_then_steps_of_8_below_256_then_16_up_to_twice_max_num_seqs():
    assert engines.vllm_sizes(1) == (1, 2)  # max capture size min(2 * 1, 512) = 2
    assert engines.vllm_sizes(4) == (1, 2, 4, 8)
    assert engines.vllm_sizes(12) == (1, 2, 4, 8, 16, 24)
    big = engines.vllm_sizes(256)  # 512: the cap
    assert big == (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
    assert engines.vllm_sizes(128)[-2:] == (248, 256)  # a max capture size of 256 is captured
    assert engines.vllm_sizes(1024) == big  # capped at 512 off data-center Blackwell
    assert engines.vllm_sizes(1024, blackwell=True)[-1] == 1024


def test_sglang_0_5_23_default_is_1_2_4_8_12_then_steps_of_8_to_256_16_to_512_32_beyond_cut_at_max_bs_and_max_bs():
    assert engines.sglang_sizes(8) == (1, 2, 4, 8)
    assert engines.sglang_sizes(12) == (1, 2, 4, 8, 12)
    assert engines.sglang_sizes(10) == (1, 2, 4, 8, 10)  # the max appended
    assert engines.sglang_sizes(30) == (1, 2, 4, 8, 12, 16, 24, 30)
    assert engines.sglang_sizes(545)[-3:] == (512, 544, 545)
    assert engines.sglang_sizes(600) == (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), 512, 544, 576, 600)


def test_tensorrt_llm_1_0_default_is_1_to_31_32_64_128_then_powers_of_two_and_the_max_itself():
    assert engines.trtllm_sizes() == (*range(1, 32), 32, 64, 128)  # max_batch_size unset: 128
    assert engines.trtllm_sizes(20) == (*range(1, 21),)
    assert engines.trtllm_sizes(40) == (*range(1, 32), 32, 40)  # the max appended
    assert engines.trtllm_sizes(600) == (*range(1, 32), 32, 64, 128, 256, 512, 600)
    assert engines.trtllm_sizes(128, enable_padding=True) == (1, 2, 4, *range(8, 129, 8))
    assert engines.trtllm_sizes(256, enable_padding=True) == (1, 2, 4, *range(8, 129, 8), 256)


def test_the_baselines_are_each_engines_default_and_graphrts_powers_of_two():
    assert engines.defaults(24) == {engines.VLLM: engines.vllm_sizes(24), engines.SGLANG: engines.sglang_sizes(24),
                                    engines.TRTLLM: engines.trtllm_sizes(24), "powers of two": (1, 2, 4, 8, 16, 32)}


SIZES = (1, 3, 8, 24)


def test_the_vllm_export_is_the_json_its_compilation_config_option_takes():
    export = engines.exports(SIZES)["vllm"]
    option, value = shlex.split(export["cli"])
    assert option == "--compilation-config"
    assert json.loads(value) == {"cudagraph_capture_sizes": list(SIZES)} == export["compilation_config"]


def test_the_sglang_0_5_23_export_parses_as_its_decode_batch_size_list():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda-graph-bs-decode", type=int, nargs="+")  # as 0.5.23 declares a List[int]
    export = engines.exports(SIZES)["sglang"]
    parsed = parser.parse_args(shlex.split(export["cli"])).cuda_graph_bs_decode
    assert parsed == list(SIZES) == export["cuda_graph_bs_decode"]


def test_the_tensorrt_llm_export_is_yaml_with_padding_on_and_the_chosen_batch_sizes():
    yaml = pytest.importorskip("yaml")  # a test extra (setup.cfg)
    export = engines.exports(SIZES)["tensorrt_llm"]
    parsed = yaml.safe_load(export["yaml"])
    assert parsed == {"cuda_graph_config": {"enable_padding": True, "batch_sizes": list(SIZES)}}
    assert parsed["cuda_graph_config"] == export["cuda_graph_config"]


def test_the_graphrt_export_is_a_buckets_option_graphrt_accepts():
    option, value = engines.exports(SIZES)["graphrt"]["cli"].split()
    assert option == "--buckets" and parse_buckets(value) == SIZES


@pytest.mark.parametrize("max_batch", [1, 7, 64])
def test_every_default_list_is_strictly_increasing_and_positive(max_batch):
    for name, sizes in engines.defaults(max_batch).items():
        assert sizes[0] >= 1 and all(a < b for a, b in zip(sizes, sizes[1:])), name
