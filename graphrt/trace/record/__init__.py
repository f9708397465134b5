"""Recording decode steps into a trace directory: under Nsight Systems or torch.profiler, each
mode in a process of its own, each rank of a `--tp` run in its own directory."""
