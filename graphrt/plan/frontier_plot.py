"""The frontier of a plan as a PNG: the best mean step against graphs and against graph memory,
with the chosen plan and the baselines marked (matplotlib, optional as for `bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphrt.io import write_png
from graphrt.units import MIB


def write_plot(doc: dict[str, Any], path: str | Path) -> str:
    """Write the PNG (atomically) and return a line saying where, or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'graphrt[plot]')"
    fig, (by_count, by_memory) = plt.subplots(1, 2, figsize=(12, 4.5))
    front = doc["frontier"]
    by_count.plot([f["graphs"] for f in front], [f["expected_ms"] for f in front], "o-", color="C0",
                  label="frontier (best per number of graphs)")
    by_memory.plot([f["graph_bytes"] / MIB for f in front], [f["expected_ms"] for f in front], "o-",
                   color="C0", label="frontier")
    marked = [("chosen", doc["chosen"], "*", 14), *((b["name"], b, "s", 7) for b in doc["baselines"]
                                                   if b["sizes"])]
    for i, (name, row, marker, size) in enumerate(marked):
        style = dict(marker=marker, markersize=size, linestyle="none", color=f"C{i + 1}", label=name)
        by_count.plot([len(row["sizes"])], [row["expected_ms"]], **style)
        by_memory.plot([row["graph_bytes"] / MIB], [row["expected_ms"]], **style)
    eager = next((b for b in doc["baselines"] if not b["sizes"]), None)
    for ax, xlabel in ((by_count, "graphs captured"), (by_memory, "graph memory (MiB)")):
        if eager is not None:
            ax.axhline(eager["expected_ms"], color="grey", linewidth=0.8, label="all eager")
        ax.set(xlabel=xlabel, ylabel="mean decode step over the traffic (ms)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    by_count.set_xscale("log", base=2)
    fig.suptitle(f"graphrt plan · {doc['model']} · {doc['machine']['device_name']} · {doc['dtype']}"
                 + (" · TapeGraphs (CPU figures)" if doc["graphs"] == "tape" else ""))
    fig.tight_layout()
    write_png(path, fig)
    plt.close(fig)
    return f"wrote {path}"
