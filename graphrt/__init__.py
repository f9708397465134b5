"""graphrt: what CUDA Graph replay removes from LLM decoding, shown, measured and explained."""

__version__ = "0.1.0"
