"""The model: configuration and families, the decoder with its static KV cache, packed
projections, tensor-parallel sharding, and loading weights. It knows nothing of NVTX, profiling,
capture or the command line."""
