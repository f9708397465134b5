"""Shared fixtures: Hugging Face reference checkpoints built from randomised weights."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from graphrt.config import PRESETS, ModelConfig


def hf_reference(config: ModelConfig, seed: int = 0):
    """HF's Qwen2ForCausalLM for `config`, every parameter randomised (biases and norms too:
    HF's own init leaves them at 0 and 1, which would never exercise them)."""
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.Qwen2Config(**config.to_hf_dict())
    model = transformers.Qwen2ForCausalLM(hf_config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else 0.02 * noise)
    return model


def save_reference(config: ModelConfig, directory: Path, seed: int = 0, **save_kwargs):
    model = hf_reference(config, seed)
    model.save_pretrained(directory, **save_kwargs)
    return model


@pytest.fixture(autouse=True)
def cpu_unless_marked_cuda(request, monkeypatch):
    """Tests not marked `cuda` run on the CPU wherever they run: on a GPU machine `--device auto`
    (and a scenario's `device = "auto"`) would otherwise pick CUDA, and a figure these tests pin
    down for the CPU (a TapeGraph, bitwise fp32 equality) would be checked against another device.
    Child processes are told the same through CUDA_VISIBLE_DEVICES."""
    if request.node.get_closest_marker("cuda") is None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(params=[False, True], ids=["untied", "tied"])
def tiny_config(request) -> ModelConfig:
    """`tiny` (4 query heads, 2 KV heads: GQA groups of 2), with and without tied embeddings."""
    return replace(PRESETS["tiny"], tie_word_embeddings=request.param)


@pytest.fixture
def cli():
    """Invoke `graphrt ...` in-process; returns click's Result (exit_code, stdout, stderr)."""
    from graphrt.cli import main

    runner = CliRunner()
    return lambda *args: runner.invoke(main, [str(a) for a in args])
