"""The lint knows a KV cache: a tensor from outside the step that the step writes in place is the
step's state, like a registered buffer, whether the cache is passed in or closed over; a cache
replaced rather than written in place is still found.

First on a hand-made one-layer decoder whose cache is a plain object (what transformers'
`StaticCache` is), then on transformers' own decode forwards with their `StaticCache`.
"""

from __future__ import annotations

import pytest
import torch
from test_lint import Net
from torch import nn

from graphrt.graphs import lint_step
from graphrt.testing import compare_replay

BATCH, SLOTS, WIDTH, PROMPT = 2, 16, 8, 5


class StaticKV:
    """A layer's static cache as transformers' StaticLayer keeps it, in a plain object (no module,
    no buffer): keys and values as the two halves of one tensor [2, B, SLOTS, W] (vLLM's layout),
    written and read through views of it, and the count of tokens written, a tensor."""

    def __init__(self) -> None:
        self.kv = torch.zeros(2, BATCH, SLOTS, WIDTH)
        self.length = torch.full((), PROMPT)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        at = torch.arange(1) + self.length  # the counter read before it is written
        self.kv[0].index_copy_(1, at, k)
        self.kv[1].index_copy_(1, at, v)
        self.length.add_(1)
        return self.kv[0], self.kv[1]


class ReboundKV(StaticKV):
    """Writes out of place and rebinds: each step leaves new tensors behind."""

    def update(self, k, v):
        at = torch.arange(1) + self.length
        self.kv = torch.stack([self.kv[0].index_copy(1, at, k), self.kv[1].index_copy(1, at, v)])
        self.length = self.length + 1
        return self.kv[0], self.kv[1]


class GrowingKV(StaticKV):
    """Appends with torch.cat, as transformers' DynamicCache does."""

    def update(self, k, v):
        self.kv = torch.cat([self.kv, torch.stack([k, v])], 2)
        return self.kv[0], self.kv[1]


class CopyOnWriteKV(StaticKV):
    """Writes in place, then hands a copy to the next step: the state changes tensor every step."""

    def update(self, k, v):
        keys, values = super().update(k, v)
        self.kv = self.kv.clone()
        return keys, values


class Decoder(nn.Module):
    """One attention layer over a cache: its keys and values written at the cache's count, the
    whole cache read under a mask built on the device from the step's positions."""

    def __init__(self, cache: StaticKV | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.cache = cache  # a plain object: nn.Module keeps it as an attribute, not a buffer

    def forward(self, x, positions, cache: StaticKV | None = None):  # x [B, W], positions [B]
        cache = cache if cache is not None else self.cache
        q, k, v = self.qkv(x).chunk(3, -1)
        keys, values = cache.update(k[:, None], v[:, None])  # [B, S, W]
        visible = torch.arange(keys.shape[1]) <= positions[:, None]  # [B, S]
        scores = torch.einsum("bw,bsw->bs", q, keys).masked_fill(~visible, float("-inf"))
        return torch.einsum("bs,bsw->bw", scores.softmax(-1), values)


X = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(0))
POSITIONS = torch.full((BATCH,), PROMPT)


def states(*caches: StaticKV) -> list[tuple]:
    """Two decode steps' inputs, the next token at the next position; a cache where given."""
    steps = [(X, POSITIONS), (X + 1, POSITIONS + 1)]
    return [(*state, *caches[k:k + 1]) for k, state in enumerate(steps)]


def lint(model: nn.Module, inputs: list[tuple]):
    with torch.inference_mode():  # as a decode step runs
        return lint_step(model, inputs)


def test_a_cache_passed_in_and_written_in_place_is_the_steps_state():
    cache = StaticKV()
    assert lint(Net(Decoder()).eval(), states(cache, cache)).clean


def test_a_cache_closed_over_by_a_plain_object_and_written_in_place_is_the_steps_state():
    assert lint(Net(Decoder(StaticKV())).eval(), states()).clean


@pytest.mark.parametrize(("cache", "op"), [(ReboundKV, "aten.index_copy.default"), (GrowingKV, "aten.cat.default")],
                         ids=["rebound", "concatenated"])
def test_a_cache_replaced_out_of_place_each_step_is_still_an_outside_tensor(cache, op):
    found = lint(Net(Decoder(cache())).eval(), states()).findings
    outside = [str(f) for f in found if f.kind == "outside-tensor"]
    assert any(line.startswith(f"{op} in body (Decoder): argument ") and
               "neither a static input nor made inside the step" in line for line in outside), found


def test_a_cache_swapped_for_another_between_steps_is_found_replaced():
    found = lint(Net(Decoder()).eval(), states(StaticKV(), StaticKV())).findings
    assert [str(f) for f in found] == [
        "aten.add.Tensor in body (Decoder): argument other is the step's state (int64 [] on cpu), "
        "written in place by aten.add_.Tensor in body (Decoder); capture 2 has another tensor in its "
        "place: the step's state was replaced between captures 1 and 2 rather than written in place; "
        "a graph keeps reading and writing capture 1's tensor; copy the new values into it instead",
        "aten.select.int in body (Decoder): argument self is the step's state (float32 [2, 2, 16, 8] "
        "on cpu), written in place by aten.index_copy_.default in body (Decoder); capture 2 has another "
        "tensor in its place: the step's state was replaced between captures 1 and 2 rather than "
        "written in place; a graph keeps reading and writing capture 1's tensor; copy the new values "
        "into it instead"]


def test_a_cache_the_step_itself_copies_after_writing_is_found_replaced():
    found = lint(Net(Decoder(CopyOnWriteKV())).eval(), states()).findings
    assert {(f.kind, f.op, f.module) for f in found} == {
        ("replaced-state", "aten.select.int", "body (Decoder)")}


class AttributeCache(nn.Module):
    """Keys in a plain tensor attribute of a module, written in place, then swapped for a copy."""

    def __init__(self, swap: bool) -> None:
        super().__init__()
        self.keys, self.swap = torch.zeros(BATCH, SLOTS), swap

    def forward(self, x, positions):  # x [B, W]
        self.keys.index_put_((torch.arange(BATCH), positions), x.sum(-1))
        if self.swap:
            self.keys = self.keys.clone()
        return self.keys.sum(-1)


def test_state_a_module_attribute_holds_is_named_by_it():
    assert lint(Net(AttributeCache(swap=False)).eval(), states()).clean
    replaced = [str(f) for f in lint(Net(AttributeCache(swap=True)).eval(), states()).findings
                if f.kind == "replaced-state"]
    assert replaced == [
        "aten.index_put_.default in body (AttributeCache): argument self is body.keys, the step's state "
        "(float32 [2, 16] on cpu), written in place by aten.index_put_.default in body (AttributeCache); "
        "capture 2 has another tensor in its place: the step's state was replaced between captures 1 "
        "and 2 rather than written in place; a graph keeps reading and writing capture 1's tensor; copy "
        "the new values into it instead"]


# transformers' own decode forward with its StaticCache, on tiny seeded models

def hf_model(kind: str):
    """A tiny seeded causal LM of transformers' `kind`, its config and an empty static cache."""
    transformers = pytest.importorskip("transformers")
    extra = {
        "mistral": {"sliding_window": None},  # full attention, as Mistral 7B v0.2 and later ship
        "gemma3_text": {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]},
    }.get(kind, {})
    config = transformers.AutoConfig.for_model(
        kind, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256, **extra)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval(), config


def prefilled_cache(hf, config):
    """A StaticCache holding a seeded prompt of PROMPT tokens, prefilled eagerly."""
    from transformers import StaticCache
    cache = StaticCache(config=config, max_cache_len=32)
    prompt = torch.randint(0, config.vocab_size, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    hf(input_ids=prompt, cache=cache, use_cache=True)
    return cache


def decode_step(hf, cache=None):
    """The next-token logits [B, V] of tokens [B, 1] at positions [B], as graphrt would capture it."""
    def step(tokens, positions, other=None):
        return hf(input_ids=tokens, position_ids=positions[:, None], cache=other if other is not None else cache,
                  use_cache=True, logits_to_keep=1).logits[:, -1]
    return step


TOKENS = torch.tensor([[7], [11]])


@pytest.mark.parametrize("kind", ["qwen2", "mistral"])
def test_transformers_decode_with_its_static_cache_is_lint_clean_and_replays_like_eager(kind):
    hf, config = hf_model(kind)
    with torch.inference_mode():
        step = decode_step(hf, prefilled_cache(hf, config))
        report = lint_step(step, [(TOKENS, POSITIONS), (TOKENS + 1, POSITIONS + 1)], model=hf, warmup=0)
        assert report.clean, report
        # clean is true of a graph: a TapeGraph of the step generates what eager does
        greedy = lambda out, tokens, positions: (out.argmax(-1, keepdim=True), positions + 1)  # noqa: E731
        replay = compare_replay(step, (TOKENS, POSITIONS), steps=4, next_inputs=greedy, model=hf, warmup=0)
    assert replay.matches, replay.divergence


def test_gemma3_sliding_window_is_left_with_the_python_int_its_cache_counts_in():
    hf, config = hf_model("gemma3_text")
    with torch.inference_mode():
        step = decode_step(hf, prefilled_cache(hf, config))
        found = lint_step(step, [(TOKENS, POSITIONS), (TOKENS + 1, POSITIONS + 1)], model=hf, warmup=0).findings
    # StaticSlidingWindowLayer.cumulative_length_int: the mask's positions come from it
    assert [str(f) for f in found] == [
        "aten.add.Tensor in model (Gemma3TextModel): argument other is 5 in capture 1 and 6 in capture 2: "
        "a Python value read at capture; replay uses 5 forever; pass it in a static input tensor"]


def test_transformers_static_cache_swapped_between_steps_is_found_replaced_in_every_layer():
    hf, config = hf_model("qwen2")
    with torch.inference_mode():
        first, second = prefilled_cache(hf, config), prefilled_cache(hf, config)
        found = lint_step(decode_step(hf), [(TOKENS, POSITIONS, first), (TOKENS + 1, POSITIONS + 1, second)],
                          model=hf, warmup=0).findings
    assert found and {f.kind for f in found} == {"replaced-state"}, found
    writers = {str(f).split("written in place by ")[1].split(";")[0] for f in found}
    assert writers == {f"aten.{op} in model.layers.{layer}.self_attn (Qwen2Attention)"
                       for op in ("index_copy_.default", "add_.Tensor") for layer in (0, 1)}
