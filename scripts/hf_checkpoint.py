"""Write a tiny seeded checkpoint of a transformers model type: what transformers itself saves,
made on the spot, so a check or a benchmark needs no download.

usage: python scripts/hf_checkpoint.py MODEL_TYPE DIR [--seed N]

Two layers of hidden size 64 (4 heads, 2 KV heads of 16, vocabulary 512, 256 positions), every
parameter drawn from the seed: norms around 1, the rest around 0 with std 0.02 (transformers'
own init leaves biases at 0 and norms at 1, which exercise nothing). `mistral` is made with full
attention in every layer (no sliding window), so a graph can capture its step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SIZES = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
# what a model type needs beyond SIZES to be small and to decode with a static cache
EXTRAS = {
    "mistral": {"sliding_window": None},
    "gemma3_text": {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]},
    "phi3": {"pad_token_id": 0},  # its default pad id lies outside a vocabulary of 512
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "decoder_sparse_step": 1},
}


def make_checkpoint(model_type: str, directory: Path, seed: int = 0) -> Path:
    """Save a tiny `model_type` causal LM with seeded weights into `directory`; returns it.
    ValueError naming the model type where transformers knows no such type."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        config = transformers.AutoConfig.for_model(model_type, **SIZES, **EXTRAS.get(model_type, {}))
    except ValueError as e:  # transformers' own words, less its list of every type it knows
        raise ValueError(f"model type {model_type!r}: {str(e).split('. Should contain')[0]}") from None
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1 + 0.1 * noise if "norm" in name else 0.02 * noise)
    model.save_pretrained(directory)
    return directory


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_type", help="a transformers model type: mistral, qwen2, phi3, mixtral, ...")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        make_checkpoint(args.model_type, args.directory, args.seed)
    except ImportError as e:
        print(f"hf_checkpoint: transformers is needed to make a checkpoint ({e})", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"hf_checkpoint: {e}", file=sys.stderr)
        return 1
    print(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
