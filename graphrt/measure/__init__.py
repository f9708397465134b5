"""Measuring instruments: NVTX ranges, timing, hardware facts and peaks, launch and op counts,
profiler sessions, the collectives' share of a step, and the roofline."""
