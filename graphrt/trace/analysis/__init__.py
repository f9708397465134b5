"""What a trace says about the decode steps: which events belong to which step, launches and
idle time, time per module (eager ranges, or carried over to a replay), and per-rank figures."""
