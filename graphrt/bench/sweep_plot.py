"""The picture of a bench run: step time and speedup over eager, against batch size and against
context length, one line per mode (and per model and value of the other axis, where several).

matplotlib is optional: without it `write_plot` says so and writes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from graphrt.io import write_png

AXES = (("batch", "batch size"), ("context", "context length (cached tokens)"))
STYLES = ("-", "--", ":", "-.")  # one per model / other-axis value; colours are modes


def _lines(doc: dict[str, Any], axis: str) -> dict[tuple[str, str], list[tuple[int, float, float | None]]]:
    """(mode, group) -> [(x, median ms, speedup vs eager)] along `axis`; a group is the model,
    the value of the other axis and tp, named only where they vary."""
    other = "context" if axis == "batch" else "batch"
    several_models = len({p["model"] for p in doc["points"]}) > 1
    several_other = len({p[other] for p in doc["points"]}) > 1
    several_tp = len({p.get("tp", 1) for p in doc["points"]}) > 1
    lines: dict[tuple[str, str], list] = defaultdict(list)
    for p in doc["points"]:
        group = " ".join([*([p["model"]] if several_models else []),
                          *([f"{other} {p[other]}"] if several_other else []),
                          *([f"tp {p.get('tp', 1)}"] if several_tp else [])])
        for mode, m in p["modes"].items():
            lines[mode, group].append((p[axis], m["step_ms"]["median"], m["speedup_vs_eager"]))
    return {key: sorted(points) for key, points in lines.items()}


def write_plot(doc: dict[str, Any], path: str | Path) -> str:
    """Write the PNG (atomically) and return a line saying where, or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'graphrt[plot]')"
    axes = [(key, title) for key, title in AXES if len({p[key] for p in doc["points"]}) > 1]
    if not axes:
        return "no plot: the results vary neither batch size nor context length"
    fig, grid = plt.subplots(len(axes), 2, figsize=(12, 4.5 * len(axes)), squeeze=False)
    colors = {mode: f"C{i}" for i, mode in enumerate(doc["modes"])}  # a mode keeps its colour
    for (key, title), (time_ax, speed_ax) in zip(axes, grid):
        lines = _lines(doc, key)
        styles = {g: STYLES[i % len(STYLES)] for i, g in enumerate(dict.fromkeys(g for _, g in lines))}
        for (mode, group), points in lines.items():
            xs = [x for x, _, _ in points]
            style = dict(color=colors[mode], linestyle=styles[group], marker="o",
                         label=f"{mode} ({group})" if group else mode)
            time_ax.plot(xs, [ms for _, ms, _ in points], **style)
            if mode != "eager" and "eager" in doc["modes"]:
                speed_ax.plot(xs, [s for _, _, s in points], **style)
        time_ax.set(yscale="log", xlabel=title, ylabel="median step (ms)",
                    title=f"decode step time vs {key}")
        speed_ax.axhline(1.0, color="grey", linewidth=0.8)
        speed_ax.set(xlabel=title, ylabel="speedup over eager (x)",
                     title=f"speedup over eager vs {key}")
        ticks = sorted({p[key] for p in doc["points"]})
        for ax in (time_ax, speed_ax):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
    s = doc["scenario"]
    fig.suptitle(f"{s['name']} · {doc['machine']['device_name']} · {doc['dtype']}"
                 + (" · partial" if doc["partial"] else ""))
    fig.tight_layout()
    write_png(path, fig)
    plt.close(fig)
    return f"wrote {path}"
