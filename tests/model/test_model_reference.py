"""graphrt's decoder computes what Hugging Face transformers computes, from the same checkpoint,
for every family it runs: Qwen2 (tied and untied), Qwen3, Llama 3 with llama3 rope."""

import pytest
import torch
from conftest import FAMILY_CONFIGS, hf_reference, save_reference

from graphrt.backends.graph import GraphBackend
from graphrt.errors import GraphrtError
from graphrt.model.config import PRESETS
from graphrt.model.decoder import greedy, inverse_frequencies
from graphrt.model.weights import build_model

CPU = torch.device("cpu")


def test_prefill_and_16_decode_steps_match_hf_logits_and_tokens(family_config, tmp_path):
    hf = save_reference(family_config, tmp_path)
    ours = build_model(family_config, CPU, torch.float32, checkpoint=tmp_path)
    batch, prompt_len, steps = 3, 40, 16  # past llama3's pretraining context of 64 by the end
    ours.setup_cache(batch, prompt_len + steps)
    prompt = torch.randint(0, family_config.vocab_size, (batch, prompt_len),
                           generator=torch.Generator().manual_seed(1))
    assert len({tuple(row) for row in prompt.tolist()}) == batch  # a different prompt per row

    with torch.no_grad():
        ours_logits = ours.prefill(prompt)
        hf_out = hf(prompt, use_cache=True)
        assert (ours_logits - hf_out.logits).abs().max() <= 1e-4
        cache, token = hf_out.cache, greedy(ours_logits[:, -1])
        assert torch.equal(token, greedy(hf_out.logits[:, -1]))
        positions = torch.full((batch,), prompt_len)
        for _ in range(steps):
            ours_step = ours.decode_step(token, positions)
            hf_out = hf(token, cache=cache, use_cache=True)
            assert (ours_step - hf_out.logits[:, -1]).abs().max() <= 1e-4
            cache, token = hf_out.cache, greedy(ours_step)
            assert torch.equal(token, greedy(hf_out.logits[:, -1]))
            positions += 1


def test_the_llama3_test_config_exercises_every_band_of_the_rescaling():
    # what makes the Llama reference test above a test of llama3 rope: some frequencies kept,
    # some divided by the factor, some interpolated between the two
    config = FAMILY_CONFIGS["llama3"]
    plain = inverse_frequencies(config.head_dim, config.rope_theta, None)
    scaled = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    kept = scaled == plain
    divided = torch.isclose(scaled, plain / config.rope_scaling.factor, rtol=1e-6, atol=0)
    between = ~kept & ~divided
    assert kept.any() and divided.any() and between.any()


def test_decode_writes_the_cache_in_place(tiny_config):
    model = build_model(tiny_config, CPU, torch.float32, seed=0)
    model.setup_cache(2, 32)
    buffers = {name: (b, b.data_ptr()) for name, b in model.named_buffers()}
    token, positions = torch.zeros(2, 1, dtype=torch.long), torch.tensor([8, 8])
    with torch.no_grad():
        model.prefill(torch.ones(2, 8, dtype=torch.long))
        for _ in range(4):
            token = greedy(model.decode_step(token, positions))
            positions += 1
    after = dict(model.named_buffers())
    assert after.keys() == buffers.keys()  # no new cache appeared
    for name, (tensor, ptr) in buffers.items():
        assert after[name] is tensor and tensor.data_ptr() == ptr, name
    # and the step really wrote there: row 1's slot 8 holds a non-zero key
    assert model.model.layers[0].self_attn.cache.k[1, :, 8].abs().sum() > 0


def ragged_prompts(vocab_size: int, lengths: list[int]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return [torch.randint(0, vocab_size, (1, n), generator=gen) for n in lengths]


def test_rows_at_different_positions_decode_as_hf_decodes_each_row_alone(family_config, tmp_path):
    # A serving batch: prompts of different lengths, right-padded into one prefill, then every
    # decode step writes and reads each row at that row's own position. HF decodes each prompt
    # on its own, unpadded: row b must see exactly its own tokens, at its own positions.
    hf = save_reference(family_config, tmp_path)
    ours = build_model(family_config, CPU, torch.float32, checkpoint=tmp_path)
    lengths, steps = [3, 9, 6], 5
    prompts = ragged_prompts(family_config.vocab_size, lengths)
    ours.setup_cache(len(lengths), max(lengths) + steps)
    padded = torch.zeros(len(lengths), max(lengths), dtype=torch.long)  # pad id 0, never attended
    for row, prompt in enumerate(prompts):
        padded[row, : prompt.shape[1]] = prompt[0]

    with torch.no_grad():
        prefill = ours.prefill(padded)
        token = torch.stack([prefill[row, n - 1] for row, n in enumerate(lengths)]).argmax(-1, keepdim=True)
        positions = torch.tensor(lengths)
        ours_steps = []
        for _ in range(steps):
            logits = ours.decode_step(token, positions)
            ours_steps.append(logits)
            token, positions = greedy(logits), positions + 1

        for row, prompt in enumerate(prompts):
            hf_out = hf(prompt, use_cache=True)
            cache, hf_token = hf_out.cache, greedy(hf_out.logits[:, -1])
            for step in range(steps):
                hf_out = hf(hf_token, cache=cache, use_cache=True)
                assert (ours_steps[step][row] - hf_out.logits[0, -1]).abs().max() <= 1e-4, (row, step)
                cache, hf_token = hf_out.cache, greedy(hf_out.logits[:, -1])


def _decode_rows(model, prompts: list[torch.Tensor], fed: torch.Tensor) -> torch.Tensor:
    """Prefill `prompts` right-padded into one batch, then decode `fed` [B, steps] (the same
    tokens for every model compared, so a near tie cannot part them): logits [B, steps, V]."""
    lengths = [p.shape[1] for p in prompts]
    device = model.lm_head.weight.device
    padded = torch.zeros(len(prompts), max(lengths), dtype=torch.long)  # pad id 0, never attended
    for row, prompt in enumerate(prompts):
        padded[row, : prompt.shape[1]] = prompt[0]
    positions, steps = torch.tensor(lengths, device=device), []
    with torch.no_grad():
        model.prefill(padded.to(device))
        for step in range(fed.shape[1]):
            steps.append(model.decode_step(fed[:, step:step + 1].to(device), positions).float().cpu())
            positions = positions + 1
    return torch.stack(steps, dim=1)


def _hf_rows(hf, prompts: list[torch.Tensor], fed: torch.Tensor) -> torch.Tensor:
    """HF decoding each prompt alone, unpadded, then `fed`: logits [B, steps, V]."""
    rows = []
    with torch.no_grad():
        for row, prompt in enumerate(prompts):
            cache, logits = hf(prompt, use_cache=True).cache, []
            for step in range(fed.shape[1]):
                out = hf(fed[row:row + 1, step:step + 1], cache=cache, use_cache=True)
                cache = out.cache
                logits.append(out.logits[0, -1])
            rows.append(torch.stack(logits))
    return torch.stack(rows)


@pytest.mark.parametrize("max_seq_len", [21, 24])
def test_the_attention_mask_is_a_real_layout_the_fused_kernels_take_as_it_is(max_seq_len):
    # what SDPA's fused CUDA backends read: the last dim contiguous (all of them), no stride-0
    # broadcast of one row over the G query rows of a group (cuDNN takes the strides as the
    # layout), every other stride a multiple of 8 (else the memory-efficient kernel copies the
    # mask in every layer); a max_seq_len that is not a multiple of 8 gets padded rows
    model = build_model(PRESETS["tiny"], CPU, torch.bfloat16, seed=0)
    model.setup_cache(3, max_seq_len)
    groups = model.model.layers[0].self_attn.groups
    for positions in (torch.tensor([[3], [9], [6]]), torch.arange(5).expand(3, -1)):  # decode, prefill
        mask = model.attention_mask(positions, torch.bfloat16)
        t = positions.shape[1]
        assert mask.shape == (3, 1, t * groups, max_seq_len)
        assert mask.stride(-1) == 1
        assert all(stride != 0 for size, stride in zip(mask.shape, mask.stride()) if size > 1), mask.stride()
        assert all(stride % 8 == 0 for stride in mask.stride()[:-1]), mask.stride()
        # and it still says what each row may see: row t*G + g of batch row b, slots 0..position
        for b in range(3):
            for row in range(t * groups):
                seen = (mask[b, 0, row] == 0).nonzero().flatten().tolist()
                assert seen == list(range(int(positions[b, row // groups]) + 1))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"])
def test_a_bf16_cuda_step_with_rows_at_different_positions_matches_hf_under_each_sdpa_backend(backend, tmp_path):
    # The mask a fused kernel is handed at batch > 1, each row at its own position, prefill
    # (T*G query rows) and decode (G rows): each backend must accept it (forced alone, SDPA
    # raises if it declines) and compute what HF computes in fp32, within bf16 rounding (the
    # CPU's bf16 step is 0.004 from HF there; a row reading another row's slots is 0.7 off)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config = FAMILY_CONFIGS["qwen2-untied"]  # GQA groups of 2, head dim 16
    hf = save_reference(config, tmp_path)
    ours = build_model(config, torch.device("cuda"), torch.bfloat16, checkpoint=tmp_path)
    lengths, steps = [3, 9, 6], 5
    prompts = ragged_prompts(config.vocab_size, lengths)
    fed = torch.randint(0, config.vocab_size, (len(lengths), steps), generator=torch.Generator().manual_seed(3))
    ours.setup_cache(len(lengths), max(lengths) + steps)
    attn = ours.model.layers[0].self_attn
    q = torch.zeros(len(lengths), attn.kv_heads, attn.groups, attn.head_dim, device="cuda", dtype=torch.bfloat16)
    kv = torch.zeros(len(lengths), attn.kv_heads, max(lengths) + steps, attn.head_dim, device="cuda",
                     dtype=torch.bfloat16)
    with sdpa_kernel(getattr(SDPBackend, backend)):
        try:  # the shape alone, no mask: a backend this torch or device lacks is not the mask's fault
            torch.nn.functional.scaled_dot_product_attention(q, kv, kv)
        except RuntimeError as error:
            pytest.skip(f"{backend} cannot run this shape here, mask or not: {error}")
        got = _decode_rows(ours, prompts, fed)
    want = _hf_rows(hf, prompts, fed)
    assert (got - want).abs().max() <= 2e-2


def test_a_model_without_its_cache_says_to_set_it_up(tiny_config):
    model = build_model(tiny_config, torch.device("cpu"), torch.float32, seed=0)
    tokens = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(GraphrtError, match=r"^the model has no KV cache yet: call setup_cache\(max_batch, max_seq_len\) first$"):
        model(tokens, torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(GraphrtError, match="the KV cache holds 0 rows, bucket 1 needs more"):
        GraphBackend(model, (1,)).prepare(1)


def test_the_state_dict_holds_the_names_hf_saves_and_no_more(family_config):
    # what a checkpoint holds: the rotary tables and the KV cache are buffers, but not saved;
    # the packed q/k/v and gate/up rows are saved under HF's own names and shapes
    ours = build_model(family_config, CPU, torch.float32, seed=0)
    ours.setup_cache(1, 8)
    hf = hf_reference(family_config, 0).state_dict()
    assert [(n, t.shape) for n, t in sorted(ours.state_dict().items())] == [
        (n, t.shape) for n, t in sorted(hf.items())]


def test_a_checkpoint_hf_saved_loads_tensor_for_tensor(family_config, tmp_path):
    hf = save_reference(family_config, tmp_path).state_dict()
    ours = build_model(family_config, CPU, torch.float32, checkpoint=tmp_path).state_dict()
    assert ours.keys() == hf.keys()
    assert all(torch.equal(ours[name], hf[name]) for name in hf)


def test_load_state_dict_takes_hf_names_and_packs_them(family_config):
    hf = hf_reference(family_config, 3).state_dict()
    ours = build_model(family_config, CPU, torch.float32, seed=0)
    assert ours.load_state_dict(hf, strict=True) is not None  # nothing missing, nothing unexpected
    layer = ours.model.layers[0]
    q, k, v = (hf[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(layer.self_attn.qkv_proj.weight, torch.cat((q, k, v)))
    gate, up = (hf[f"model.layers.0.mlp.{n}_proj.weight"] for n in ("gate", "up"))
    assert torch.equal(layer.mlp.gate_up_proj.weight, torch.cat((gate, up)))
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: [^\n]*\"model\.layers\.0\.mlp\.up_proj\.weight\""):
        ours.load_state_dict({n: t for n, t in hf.items() if n != "model.layers.0.mlp.up_proj.weight"})


def test_a_missing_packed_part_is_named_alone_and_the_other_kinds_still_load():
    # Qwen2's q/k/v have biases: without q_proj's weight, the packed biases still load from
    # their parts, and only the absent part is reported, by its checkpoint name
    config = FAMILY_CONFIGS["qwen2-untied"]
    hf = hf_reference(config, 3).state_dict()
    ours = build_model(config, CPU, torch.float32, seed=0)
    result = ours.load_state_dict({n: t for n, t in hf.items() if n != "model.layers.1.self_attn.q_proj.weight"},
                                  strict=False)
    assert "model.layers.1.self_attn.q_proj.weight" in result.missing_keys
    q, k, v = (hf[f"model.layers.1.self_attn.{n}_proj.bias"] for n in "qkv")
    assert torch.equal(ours.model.layers[1].self_attn.qkv_proj.bias, torch.cat((q, k, v)))
