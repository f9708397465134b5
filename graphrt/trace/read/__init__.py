"""Reading traces back into one event model: torch.profiler Chrome JSON (streamed) and Nsight
Systems SQLite exports."""
