"""graphrt's wrapper of a transformers model (graphrt.model.hf_causal.HFCausalLM): transformers'
module names in the state_dict and the NVTX ranges, its StaticCache allocated once up front,
and an experts implementation a graph can capture unless the user picks another."""

import pytest
import torch
from hf_checkpoints import WITH_EXPERTS, lack_grouped_mm, reference

from graphrt.errors import GraphrtError
from graphrt.measure import nvtx
from graphrt.measure.range_names import module_range_name
from graphrt.run.execute import load, run
from graphrt.run.spec import RunSpec


def loaded(directory, **kwargs):
    return load(RunSpec(model=str(directory), device="cpu", dtype="float32", **kwargs))[1]


def one_step(model, position: int = 4) -> torch.Tensor:
    """One decode step of every cache row at `position`: logits [max_batch, V]."""
    tokens = torch.arange(1, model.max_batch + 1).unsqueeze(1)
    with torch.inference_mode():
        model.seek(position)
        return model.decode_step(tokens, torch.full((model.max_batch,), position))


def test_the_state_dict_is_transformers_own_names_and_tensors(hf_checkpoint):
    directory = hf_checkpoint("mistral")
    mine, theirs = loaded(directory).state_dict(), reference(directory).state_dict()
    assert list(mine) == list(theirs)
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)


def test_nvtx_ranges_carry_transformers_module_paths_and_classes(hf_checkpoint):
    directory = hf_checkpoint("mistral")
    model = loaded(directory)
    model.setup_cache(2, 16)
    with nvtx.attach(model), nvtx.record_to([]) as events:
        one_step(model)
    opened = {name for kind, name in events if kind == "push"}
    assert "model.layers.0.self_attn (MistralAttention)" in opened
    assert "model.layers.1.mlp (MistralMLP)" in opened
    # every range but the root's names a module of transformers' own tree, by path and class
    theirs = {module_range_name(q, m) for q, m in reference(directory).named_modules() if q}
    assert opened - theirs == {"(HFCausalLM)"}


def test_the_cache_is_allocated_in_setup_and_every_step_writes_into_the_same_tensors(hf_checkpoint):
    model = loaded(hf_checkpoint("mistral"))
    model.setup_cache(2, 16)
    layers = model.cache.layers
    addresses = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in layers]
    assert all(layer.keys.shape[0] == 2 and layer.keys.shape[2] == 16 for layer in layers)
    assert all(not layer.keys.any() for layer in layers)  # setup's throwaway token is gone
    with torch.inference_mode():
        model.prefill(torch.ones(2, 4, dtype=torch.long))
    one_step(model)
    assert [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in layers] == addresses
    assert all(layer.keys[:, :, 4].any() and not layer.keys[:, :, 5:].any() for layer in layers)


def cache_tensors(model) -> list[torch.Tensor]:
    return [t for layer in model.cache.layers for t in (layer.keys, layer.values, layer.cumulative_length)]


def test_the_caches_tensors_are_ordinary_so_a_seek_outside_inference_mode_moves_every_counter(hf_checkpoint):
    # An inference tensor refuses in-place writes outside inference mode, and the graph backend
    # seeks before its captures there; on CUDA the counter moves to the device at the cache's
    # first write, so made inside inference mode it would be one (see the CUDA test below).
    model = loaded(hf_checkpoint("gemma3_text"))
    model.setup_cache(2, 16)
    assert not any(t.is_inference() for t in cache_tensors(model))
    model.seek(3)
    assert [int(layer.cumulative_length) for layer in model.cache.layers] == [3] * len(model.cache.layers)
    assert all(getattr(layer, "cumulative_length_int", 3) == 3 for layer in model.cache.layers)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_caches_counters_on_the_device_take_a_seek_outside_inference_mode(hf_checkpoint):
    model = load(RunSpec(model=str(hf_checkpoint("mistral")), device="cuda", dtype="bfloat16"))[1]
    model.setup_cache(2, 16)
    assert all(t.is_cuda and not t.is_inference() for t in cache_tensors(model))
    model.seek(3)
    assert [int(layer.cumulative_length) for layer in model.cache.layers] == [3] * len(model.cache.layers)


def test_a_step_run_again_after_seek_gives_the_logits_it_gave_the_first_time(hf_checkpoint):
    # gemma3's sliding-window layers (window 8) keep their write position as a Python int too,
    # which picks a branch: below the window a write at the position, at it a shift of the whole
    # window. Step 7 fills the window; seek must bring both counters back for step 6 to run as
    # it did. (Past the window no seek can: each step has shifted out what an earlier one saw.)
    model = loaded(hf_checkpoint("gemma3_text"))
    model.setup_cache(2, 16)
    with torch.inference_mode():
        model.prefill(torch.ones(2, 6, dtype=torch.long))
    first = one_step(model, position=6)
    one_step(model, position=7)
    assert torch.equal(one_step(model, position=6), first)


def test_a_batch_above_the_caches_rows_is_refused(hf_checkpoint):
    model = loaded(hf_checkpoint("mistral"))
    model.setup_cache(2, 16)
    with pytest.raises(GraphrtError, match="batch 3 exceeds the KV cache's 2 rows"), torch.inference_mode():
        model.prefill(torch.ones(3, 4, dtype=torch.long))


@pytest.mark.parametrize("model_type", WITH_EXPERTS)
def test_by_default_a_model_with_experts_runs_one_a_graph_can_capture(hf_checkpoint, model_type):
    transformers = pytest.importorskip("transformers")
    directory = hf_checkpoint(model_type)
    # transformers' own default: grouped_mm where the device has it, else its loop
    default = transformers.AutoModelForCausalLM.from_pretrained(directory).config._experts_implementation
    assert loaded(directory).experts == (default if default != "eager" else "batched_mm")
    assert loaded(directory, experts="eager").experts == "eager"  # the user's pick stands


def test_where_the_device_lacks_grouped_mm_the_default_is_batched_mm_and_a_graph_captures_it(
        hf_checkpoint, monkeypatch):
    lack_grouped_mm(monkeypatch)
    directory = hf_checkpoint("mixtral")
    assert reference(directory).config._experts_implementation == "eager"  # transformers' fallback
    assert loaded(directory).experts == "batched_mm"  # graphrt's: its loop reads counts to the host
    result = run(RunSpec(model=str(directory), mode="eager,graph", batch=2, prompt_len=6, steps=4, device="cpu"))
    assert result.refused == {}
    assert torch.equal(result.generations["graph"].tokens, result.generations["eager"].tokens)

