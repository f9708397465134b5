"""One `graphrt run`: its spec, the decode loop, running each mode, checking every mode against
eager and saying where a graph mode differs, per-rank figures, the table and JSON, text prompts."""
