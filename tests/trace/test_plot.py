"""`graphrt analyze --plot`: one eager step above one replayed step, drawn from an Nsight Systems
export, a GPU Chrome trace and a CPU trace; each PNG is read back and looked at."""

from pathlib import Path

import pytest

from graphrt.measure.range_names import KIND_COLORS
from graphrt.trace.analysis.timeline import StepTimeline, Work
from graphrt.trace.present.step_picture import plot_steps

mpimg = pytest.importorskip("matplotlib.image")

DATA = Path(__file__).parents[1] / "data"


def _pixels(path: Path):
    image = mpimg.imread(path)  # [H, W, 4] floats in 0..1
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 800
    return image[..., :3]


def _pixels_of(rgb, argb: int) -> int:
    """How many pixels are painted in the colour `argb` (within rounding)."""
    want = [((argb >> shift) & 0xFF) / 255 for shift in (16, 8, 0)]
    close = (abs(rgb[..., 0] - want[0]) < 0.02) & (abs(rgb[..., 1] - want[1]) < 0.02) & (abs(rgb[..., 2] - want[2]) < 0.02)
    return int(close.sum())


def _not_blank(rgb) -> float:
    return float((rgb.min(axis=-1) < 0.9).mean())


@pytest.mark.parametrize("trace", [DATA / "nsys" / "nsysai-h100-2gpu-nsys2026.2.sqlite",
                                   DATA / "torch" / "hta-v100-graph-launches.json.gz"], ids=["nsys", "chrome"])
def test_a_gpu_trace_is_drawn(cli, tmp_path, trace):
    out = tmp_path / "step.png"
    result = cli("analyze", trace, "--plot", out)
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout
    assert _not_blank(_pixels(out)) > 0.02
    assert [p.name for p in tmp_path.iterdir()] == ["step.png"]  # no temporary left behind


def test_a_cpu_trace_draws_eager_above_replay_coloured_by_module_kind(cli, tmp_path, tiny_torch_traces):
    out = tmp_path / "step.png"
    result = cli("analyze", tiny_torch_traces, "--plot", out)
    assert result.exit_code == 0, result.output
    assert "decode_step[eager] above replay[bs=1]" in result.stdout
    rgb = _pixels(out)
    height = rgb.shape[0]
    # the upper axes and the lower ones, without the legend along the bottom
    eager_half, replay_half = rgb[: height // 2], rgb[height // 2: int(height * 0.88)]
    # the replay fired no module range: its ops are coloured by what the alignment gave them
    for kind in ("attention", "mlp"):
        assert _pixels_of(eager_half, KIND_COLORS[kind]) > 20, kind
        assert _pixels_of(replay_half, KIND_COLORS[kind]) > 20, kind


def test_a_tape_replay_alone_is_coloured_from_its_capture_records(cli, tmp_path, tiny_torch_traces):
    # no eager step to align with: the kinds come from summary.json's captured ops, as analyze's do
    out = tmp_path / "replay.png"
    result = cli("analyze", tiny_torch_traces / "graph.json", "--plot", out)
    assert result.exit_code == 0, result.output
    assert "replay[bs=1] above replay[bs=1]" in result.stdout
    rgb = _pixels(out)
    for kind in ("attention", "mlp"):
        assert _pixels_of(rgb[: int(rgb.shape[0] * 0.88)], KIND_COLORS[kind]) > 40, kind


def test_short_ops_keep_their_colour_in_a_step_a_stall_stretched(tmp_path):
    # a preempted host stretches the eager step to 50 ms; its 2 µs mlp op is a hundredth of a
    # pixel wide there, and would be blended away without the picture's minimum width
    attn, mlp = "model.layers.0.self_attn (Qwen2Attention)", "model.layers.0.mlp (Qwen2MLP)"
    ops = [Work("aten::mm", 0, 50_000_000, None, (attn,), None), Work("aten::mul", 50_000_000, 50_002_000, None, (mlp,), None)]
    eager = StepTimeline("decode_step[eager]", "decode_step[eager]", 0, 50_002_000, "op", ops, [])
    out = tmp_path / "stall.png"
    plot_steps([[eager]], ["stalled"], out)
    rgb = _pixels(out)
    rgb = rgb[: int(rgb.shape[0] * 0.88)]  # without the legend
    assert _pixels_of(rgb, KIND_COLORS["mlp"]) > 20
