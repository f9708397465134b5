"""The HF peer decodes what graphrt's eager step decodes, on the very same weight tensors."""

import pytest
import torch

from graphrt.backends.eager import EagerBackend
from graphrt.backends.peer import PeerBackend, unavailable
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
