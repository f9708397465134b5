"""`graphrt bench`: when do CUDA graphs pay? Launch overhead is a fixed cost per step, so its
share falls as batch and context grow; a sweep over scenarios of batch and context shows where.

    scenario.py    the TOML scenario files: schema, reading, validation
    sweep.py       the sweep: one model per name, fresh cache and backends per point
    results.py     the JSON document, its tables, and comparing two runs
    sweep_plot.py  step time and speedup against batch
"""
