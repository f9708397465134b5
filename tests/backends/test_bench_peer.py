"""The HF peer decodes what graphrt's eager step decodes, on the very same weight tensors."""

import pytest
import torch

from graphrt.backends.eager import EagerBackend
from graphrt.backends.peer import PeerBackend, unavailable
from graphrt.errors import GraphrtError
from graphrt.model.weights import build_model
from graphrt.run.decode import count_launches, decode, random_prompt

pytest.importorskip("transformers")


def test_peer_runs_here():
    assert unavailable() is None


def test_peer_generates_eagers_tokens_on_shared_weights(tiny_config):
    model = build_model(tiny_config, torch.device("cpu"), torch.float32)
    peer = PeerBackend(model)
    hf = peer.hf
    assert hf.model.embed_tokens.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert hf.model.layers[1].mlp.down_proj.weight.data_ptr() == \
        model.model.layers[1].mlp.down_proj.weight.data_ptr()
    tied = hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    assert tied == tiny_config.tie_word_embeddings

    model.setup_cache(2, 24)
    prompt = random_prompt(2, 6, tiny_config.vocab_size, seed=3)
    eager = decode(EagerBackend(model), prompt, steps=12, warmup=2, keep_logits=False)
    ours = decode(peer, prompt, steps=12, warmup=2, keep_logits=False)
    assert torch.equal(ours.tokens, eager.tokens)
    assert len(ours.step_ms) == len(ours.host_ms) == 10
    # its step counts like ours: more aten ops than graphrt's step (HF's cache update, mask)
    counted = count_launches([(peer, ours), (EagerBackend(model), eager)], 6)
    assert counted[peer.name].ops > counted["eager"].ops


PEER_SWEEP = """
models = ["tiny"]
modes = ["eager"]
batch_sizes = [2]
context_lengths = [16]
steps = 3
warmup = 1
repeats = 1
peer = true
threads = 1
"""


@pytest.mark.slow
def test_bench_counts_the_peers_timed_step_a_static_cache_step_after_the_prompt(tmp_path):
    from graphrt.bench.scenario import load_scenario
    from graphrt.bench.sweep import Sweep
    from graphrt.model.config import PRESETS

    path = tmp_path / "peer.toml"
    path.write_text(PEER_SWEEP)
    scenario = load_scenario(path)
    counted_by_bench = Sweep(scenario).run()["points"][0]["modes"]["hf"]["ops_per_step"]

    # the step bench timed: HF's step on the StaticCache its prefill of the prompt made
    model = build_model(PRESETS["tiny"], torch.device("cpu"), torch.float32)
    model.setup_cache(2, scenario.max_seq_len(scenario.points()[0]))
    timed = PeerBackend(model)
    prompt = random_prompt(2, scenario.prompt_len, model.config.vocab_size, scenario.seed)
    generation = decode(timed, prompt, steps=2, warmup=0, keep_logits=False)
    with torch.inference_mode():
        timed.prefill(prompt)
    assert counted_by_bench == count_launches([(timed, generation)], scenario.prompt_len)["hf"].ops


def test_the_peer_refuses_a_step_before_a_prefill_made_its_static_cache(tiny_config):
    # without its StaticCache, HF would step a one-token dynamic cache: another step than the one timed
    model = build_model(tiny_config, torch.device("cpu"), torch.float32)
    model.setup_cache(1, 16)
    with pytest.raises(GraphrtError, match="prefill"):
        PeerBackend(model).step(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
