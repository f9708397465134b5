"""Backends: one decode step (`model.decode_step`), run in different ways (docs/design.md, Invariants, 1).

`base` says what a backend is; `choices` holds what a user picks of them (the modes, the graph
buckets) without importing torch, so the command line checks them and prints its help at once.
"""
