"""`graphrt plan`: which batch sizes to capture for a server's traffic, measured on this machine
and set against each serving engine's default list as its server resolves it.

    traffic.py          reading a traffic: decode steps per batch size
    fit.py              what measuring will hold, refused up front where the device cannot
    measure_sizes.py    figures per batch size (a grid, the rest interpolated)
    size_rounds.py      timed in interleaved rounds, outliers left out
    optimize.py         the exact optimum under a budget, and the frontier
    engine_lists.py     --engine-setting ENGINE.NAME=VALUE, checked at once (torch-free); each
                        engine's default list as its server resolves it (graphrt.engines has the
                        rules), and the chosen list in each engine's option
    summary.py          the plan's rows, its table and JSON
    spread.py           each row against the chosen plan with its interval; too noisy to choose
    check.py            the chosen plan captured for real and timed on a sample of the traffic
    frontier_plot.py    the frontier's PNG
    planner.py          the plan itself, from options to its document
"""
