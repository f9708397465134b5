"""`graphrt bench`: when do CUDA graphs pay? Launch overhead is a fixed cost per step, so its
share falls as batch and context grow; a sweep over both shows where.

    scenario.py  the TOML scenario files: schema, reading, validation
    runner.py    the sweep: one model per name, fresh cache and backends per point
    peer.py      Hugging Face transformers' eager decode, the peer on the same weights
    roofline.py  bytes and FLOPs per step from shapes; achieved share of the ceilings
    results.py   the JSON document, its tables, and comparing two runs
    plot.py      step time and speedup against batch and context (matplotlib, optional)
    command.py   the click command
"""
