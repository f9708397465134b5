"""A step captured in pieces between the calls of chosen modules (graphrt.graphs.segments): the
graphs replayed with the modules run eagerly between them recompute what eager computes, the
breaks are the innermost modules that take a KV cache, and a capture that fails leaves every
module's forward as it was and says why in one line, the refusal first."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphrt.graphs import GraphCaptureError, new_pool
from graphrt.graphs.segments import attention_modules, capture_pieces

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class Cache:
    """A KV cache held by no module: what the step writes in place at its positions."""

    def __init__(self, rows: int, slots: int, width: int, device: str):
        self.kv = torch.zeros(rows, slots, width, device=device)


class Attention(nn.Module):
    """Writes x at `position` into the cache, then mixes every slot so far: its output depends on
    everything earlier steps wrote, so a replay that skipped it, or ran it on stale inputs, differs."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, position: torch.Tensor, cache: Cache) -> torch.Tensor:
        cache.kv.index_copy_(1, position, self.proj(x).unsqueeze(1))
        seen = torch.arange(cache.kv.shape[1], device=x.device) <= position  # [S]
        return (cache.kv * seen[None, :, None]).sum(1)


class Layer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.attn, self.mlp = Attention(width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor, position: torch.Tensor, cache: Cache) -> torch.Tensor:
        x = x + self.attn(torch.tanh(x), position, cache)
        return x + self.mlp(x)


class Decoder(nn.Module):
    def __init__(self, width: int = 8, layers: int = 3, device: str = "cpu"):
        super().__init__()
        self.layers = nn.ModuleList(Layer(width) for _ in range(layers))
        self.head = nn.Linear(width, 5)
        self.caches = [Cache(2, 16, width, device) for _ in range(layers)]
        self.to(device)

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        for layer, cache in zip(self.layers, self.caches):
            x = layer(x, position, cache)
        return self.head(x)


def test_the_breaks_are_the_innermost_modules_that_take_the_cache():
    model = Decoder()
    assert attention_modules(model) == [layer.attn for layer in model.layers]


def replays_like_eager(device: str) -> None:
    torch.manual_seed(0)
    model = Decoder(device=device)
    x = torch.zeros(2, 8, device=device)
    position = torch.zeros(1, dtype=torch.long, device=device)
    with torch.inference_mode():
        graphs, breaks, out = capture_pieces(lambda: model(x, position), attention_modules(model),
                                             device=torch.device(device), pool=new_pool(device))
        assert len(graphs) == 4 and [module for module, _ in breaks] == attention_modules(model)
        for cache in model.caches:
            cache.kv.zero_()
        replayed = []
        for step in range(5):  # each step writes a slot and reads every slot before it
            x.copy_(torch.randn(2, 8, device=device))
            position.fill_(step)
            for graph, (_, run) in zip(graphs, breaks):
                graph.replay()
                run()
            graphs[-1].replay()
            replayed.append(out.clone())
        for cache in model.caches:
            cache.kv.zero_()
        torch.manual_seed(0)
        Decoder(device=device)  # the same draws, so the inputs below repeat the replay's
        for step, logits in enumerate(replayed):
            x.copy_(torch.randn(2, 8, device=device))
            position.fill_(step)
            torch.testing.assert_close(logits, model(x, position), rtol=1e-5, atol=1e-6)


def test_pieces_replayed_with_their_breaks_eager_between_them_decode_like_eager():
    replays_like_eager("cpu")


def test_a_piece_that_a_capture_refuses_names_its_op_and_leaves_every_forward_as_it_was():
    model = Decoder()
    for layer in model.layers:  # a host sync after the first break: the second piece refuses it
        layer.mlp.forward = lambda x, mlp=layer.mlp: nn.Linear.forward(mlp, x) * float(x.sum() > 0)
    before = [vars(module).get("forward") for module in attention_modules(model)]
    with torch.inference_mode(), pytest.raises(GraphCaptureError, match="host sync"):
        capture_pieces(lambda: model(torch.ones(2, 8), torch.zeros(1, dtype=torch.long)),
                       attention_modules(model), device=torch.device("cpu"), pool=new_pool("cpu"), warmup=0)
    assert [vars(module).get("forward") for module in attention_modules(model)] == before == [None] * 3


def swallows_a_refusal(model: Decoder) -> None:
    """Each layer's MLP tries a host sync and, as library code does around a fast path, catches
    whatever that raised and fails in its own words."""
    for layer in model.layers:
        def forward(x: torch.Tensor, mlp: nn.Linear = layer.mlp) -> torch.Tensor:
            try:
                x.sum().item()
            except Exception:
                raise RuntimeError("the fast path is unavailable") from None
            return nn.Linear.forward(mlp, x)
        layer.mlp.forward = forward


def test_a_refusal_the_step_swallows_is_what_the_capture_raises_not_the_steps_later_failure():
    model = Decoder()
    swallows_a_refusal(model)
    with torch.inference_mode(), pytest.raises(GraphCaptureError, match="host sync"):
        capture_pieces(lambda: model(torch.ones(2, 8), torch.zeros(1, dtype=torch.long)),
                       attention_modules(model), device=torch.device("cpu"), pool=new_pool("cpu"), warmup=0)


@pytest.mark.cuda
@needs_cuda
def test_cuda_pieces_replayed_with_their_breaks_eager_between_them_decode_like_eager():
    replays_like_eager("cuda")


@pytest.mark.cuda
@needs_cuda
def test_cuda_pieces_say_what_each_took_from_the_device():
    model = Decoder(device="cuda")
    x, position = torch.zeros(2, 8, device="cuda"), torch.zeros(1, dtype=torch.long, device="cuda")
    with torch.inference_mode():
        graphs, _, _ = capture_pieces(lambda: model(x, position), attention_modules(model),
                                      device=torch.device("cuda", torch.cuda.current_device()),
                                      pool=new_pool("cuda"))
    assert all(graph.memory_bytes >= 0 and isinstance(graph.device_bytes, int) for graph in graphs)


@pytest.mark.cuda
@needs_cuda
def test_an_op_cuda_refuses_inside_a_piece_is_a_capture_error_in_one_line_and_the_caller_stream_is_back():
    model = Decoder(device="cuda")
    for layer in model.layers:  # a device sync after the first break: CUDA refuses it in a capture
        layer.mlp.forward = lambda x, mlp=layer.mlp: (torch.cuda.synchronize(), nn.Linear.forward(mlp, x))[1]
    caller = torch.cuda.current_stream()
    with torch.inference_mode(), pytest.raises(GraphCaptureError, match="CUDA graph capture failed"):
        capture_pieces(lambda: model(torch.ones(2, 8, device="cuda"), torch.zeros(1, dtype=torch.long, device="cuda")),
                       attention_modules(model), device=torch.device("cuda", torch.cuda.current_device()),
                       pool=new_pool("cuda"), warmup=0)
    assert torch.cuda.current_stream() == caller
    assert all(vars(module).get("forward") is None for module in attention_modules(model))
