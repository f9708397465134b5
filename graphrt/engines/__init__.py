"""What graphrt knows of each serving engine, one module each: the step markers it writes, how its
server resolves its capture sizes from settings, the versions those rules were read at, and the
option that takes a plan's list. Torch-free.

    step_marker.py   what a marker states (the Marker, its tier, its counts)
    engine.py        the Engine record a module fills in, and the capture list's types
    vllm.py, sglang.py, tensorrt_llm.py, atom.py   the engines
    registry.py      the engines, in order
"""
