"""What a sweep gives back between points, and in which order, before the next point's memory is read."""

import gc

import torch

from graphrt.bench.sweep import release_memory


def _record_releases(monkeypatch) -> list[str]:
    """Each release the sweep asks of torch and Python, in order, instead of doing it."""
    calls: list[str] = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append("dynamo reset"))
    monkeypatch.setattr(gc, "collect", lambda *_: calls.append("collect"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty cache"))
    return calls


def test_the_cuda_cache_is_emptied_after_dynamos_compiled_steps_and_the_garbage_are_released(monkeypatch):
    # a reduce-overhead step's graph trees hold their pool until Dynamo's reset: emptied before
    # it, the cache would keep that pool reserved when the next point's memory is read
    calls = _record_releases(monkeypatch)
    release_memory(torch.device("cuda"), compiled=True)
    assert calls == ["dynamo reset", "collect", "empty cache"]


def test_without_compile_or_cuda_only_the_garbage_is_collected(monkeypatch):
    calls = _record_releases(monkeypatch)
    release_memory(torch.device("cpu"), compiled=False)
    assert calls == ["collect"]
