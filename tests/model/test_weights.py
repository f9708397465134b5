"""Loading checkpoints: single file, shards, and every way one can be wrong."""

import json
from dataclasses import replace

import pytest
import torch
from conftest import save_reference
from safetensors.torch import load_file, save_file

from graphrt.errors import GraphrtError
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model

CPU = torch.device("cpu")


def test_sharded_checkpoint_loads_identically_to_a_single_file(tiny_config, tmp_path):
    save_reference(tiny_config, tmp_path / "single")
    save_reference(tiny_config, tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    single = build_model(tiny_config, CPU, torch.float32, checkpoint=tmp_path / "single")
    sharded = build_model(tiny_config, CPU, torch.float32, checkpoint=tmp_path / "sharded")
    a, b = single.state_dict(), sharded.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_tied_checkpoint_shares_one_tensor_between_embedding_and_head(tmp_path):
    config = replace(PRESETS["tiny"], tie_word_embeddings=True)
    save_reference(config, tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    model = build_model(config, CPU, torch.float32, checkpoint=tmp_path)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_loading_casts_to_the_requested_dtype(tmp_path):
    config = PRESETS["tiny"]
    save_reference(config, tmp_path)
    model = build_model(config, CPU, torch.bfloat16, checkpoint=tmp_path)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_random_init_randomises_every_parameter_reproducibly():
    config = PRESETS["tiny"]
    a = build_model(config, CPU, torch.float32, seed=7)
    b = build_model(config, CPU, torch.float32, seed=7)
    for name, p in a.named_parameters():
        assert p.std() > 0, f"{name} is constant"  # biases and norm weights too
        assert torch.equal(p, b.get_parameter(name)), name
    assert not torch.equal(a.lm_head.weight, build_model(config, CPU, torch.float32, seed=8).lm_head.weight)


def _resave(directory, change):
    tensors = load_file(directory / "model.safetensors")
    change(tensors)
    save_file(tensors, directory / "model.safetensors")


def test_a_missing_tensor_is_named(tmp_path):
    save_reference(PRESETS["tiny"], tmp_path)
    _resave(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(GraphrtError, match=r"lacks tensor\(s\) model\.layers\.1\.mlp\.up_proj\.weight"):
        build_model(PRESETS["tiny"], CPU, torch.float32, checkpoint=tmp_path)


def test_a_misshaped_tensor_is_named_with_both_shapes(tmp_path):
    save_reference(PRESETS["tiny"], tmp_path)
    _resave(tmp_path, lambda t: t.update({"model.norm.weight": torch.ones(65)}))
    with pytest.raises(GraphrtError, match=r"model\.norm\.weight has shape \(65,\), expected \(64,\)"):
        build_model(PRESETS["tiny"], CPU, torch.float32, checkpoint=tmp_path)


@pytest.mark.parametrize("lost", [[0], [0, -1]], ids=["one", "two"])
def test_every_shard_named_by_the_index_but_missing_is_named(tmp_path, lost):
    save_reference(PRESETS["tiny"], tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2
    gone = [shards[i] for i in lost]
    for name in gone:
        (tmp_path / name).unlink()
    with pytest.raises(GraphrtError, match=f"names shard\\(s\\) {', '.join(gone)}, missing from "):
        build_model(PRESETS["tiny"], CPU, torch.float32, checkpoint=tmp_path)


def test_unexpected_tensors_are_reported(tmp_path):
    from graphrt.model.weights import load_checkpoint

    save_reference(PRESETS["tiny"], tmp_path)
    _resave(tmp_path, lambda t: t.update({"model.extra.bias": torch.zeros(3)}))
    model = build_model(PRESETS["tiny"], CPU, torch.float32, seed=0)
    assert load_checkpoint(model, tmp_path) == ["model.extra.bias"]
