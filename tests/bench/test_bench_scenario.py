"""Bench scenarios: the shipped files parse, and a bad file gets one line naming file and key."""

from pathlib import Path

import pytest

from graphrt.bench.scenario import Point, load_scenario, with_overrides
from graphrt.errors import GraphrtError

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"

VALID = """
models = ["tiny"]
batch_sizes = [1, 4]
context_lengths = [32, 64]
"""


def write(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_scenarios_parse_and_sweep_what_they_promise():
    loaded = {p.stem: load_scenario(p) for p in SCENARIOS.glob("*.toml")}
    assert set(loaded) >= {"baseline", "batch_sweep", "context_sweep", "models"}
    assert loaded["baseline"].models == ("tiny",)
    batch = loaded["batch_sweep"]
    assert batch.models == ("qwen2-0.5b",) and batch.batch_sizes == (1, 2, 4, 8, 16, 32, 64)
    assert batch.modes == ("eager", "piecewise", "graph", "compile")
    context = loaded["context_sweep"]
    assert context.batch_sizes == (1,) and context.context_lengths[0] == 128
    assert context.context_lengths[-1] == 8192
    assert loaded["models"].models == ("qwen2-0.5b", "qwen2-1.5b", "qwen2-7b")


def test_defaults_and_the_sweep_order(tmp_path):
    s = load_scenario(write(tmp_path, VALID, "mine.toml"))
    assert s.name == "mine" and s.modes == ("eager", "graph") and s.peer
    assert s.points() == [Point("tiny", 1, 32), Point("tiny", 4, 32),
                          Point("tiny", 1, 64), Point("tiny", 4, 64)]
    # every decode step of a repeat fits in the cache
    assert s.max_seq_len(Point("tiny", 1, 64)) == 64 + s.warmup + s.steps


def test_overrides_are_validated_and_recorded(tmp_path):
    s = with_overrides(load_scenario(write(tmp_path, VALID)), steps=5, repeats=None, max_points=3)
    assert (s.steps, s.repeats) == (5, 3) and len(s.points()) == 3
    assert s.overridden == ("steps", "max_points")
    with pytest.raises(GraphrtError, match="steps must be at least 2"):
        with_overrides(s, steps=1)


@pytest.mark.parametrize("text, fragments", [
    (VALID + "stpes = 10\n", ["unknown key 'stpes'", "steps"]),
    (VALID + 'steps = "many"\n', ["steps must be an integer, got 'many'"]),
    (VALID + "peer = 1\n", ["peer must be true or false, got 1"]),
    (VALID + "max_spread = true\n", ["max_spread must be a number, got True"]),
    (VALID.replace("[1, 4]", '[1, "4"]'), ["batch_sizes must be a list of integers, got '4'"]),
    (VALID.replace('["tiny"]', '"tiny"'), ["models must be a list, got 'tiny'"]),
    (VALID.replace("[1, 4]", "[]"), ["batch_sizes is empty"]),
    (VALID.replace("[32, 64]", "[]"), ["context_lengths is empty"]),
    (VALID.replace("[1, 4]", "[4, 4]"), ["batch_sizes lists a value twice"]),
    (VALID.replace("[1, 4]", "[0, 4]"), ["batch_sizes must be positive integers, got 0"]),
    ('models = ["tiny"]\nbatch_sizes = [1]\n', ["missing key(s) context_lengths"]),
    (VALID + 'modes = ["eager", "warp"]\n', ["modes: 'warp' is not one of eager, piecewise, graph, compile"]),
    (VALID + "prompt_len = 40\n", ["prompt_len 40 exceeds the smallest context length 32"]),
    (VALID + "warmup = 0\n", ["warmup must be at least 1"]),
    (VALID + 'device = "tpu"\n', ["device must be auto, cpu or cuda, got 'tpu'"]),
    (VALID + 'dtype = "int8"\n', ["dtype must be auto or one of"]),
    (VALID + "models = [\n", ["invalid TOML"]),
])
def test_bad_scenario_names_the_file_and_the_key(tmp_path, text, fragments):
    path = write(tmp_path, text)
    with pytest.raises(GraphrtError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_missing_file(tmp_path):
    with pytest.raises(GraphrtError, match="no such scenario file"):
        load_scenario(tmp_path / "nope.toml")


def test_cli_reports_a_bad_scenario_on_one_line(cli, tmp_path):
    path = write(tmp_path, VALID + "stpes = 10\n")
    result = cli("bench", path, "--out", tmp_path / "out")
    assert result.exit_code == 1
    assert result.stderr.strip() == (f"error: {path}: unknown key 'stpes' (expected one of "
                                     "name, description, models, device, dtype, modes, batch_sizes, "
                                     "context_lengths, prompt_len, steps, warmup, repeats, seed, "
                                     "peer, max_spread, threads, tp)")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_context_beyond_the_model_is_refused_before_anything_runs(cli, tmp_path):
    path = write(tmp_path, VALID.replace("[32, 64]", "[32, 4096]"))  # tiny holds 4096 positions
    result = cli("bench", path, "--out", tmp_path / "out")
    assert result.exit_code == 1
    assert "context 4096 + 72 decode steps exceeds tiny's max_position_embeddings 4096" in result.stderr


def test_cli_needs_a_scenario_or_compare(cli, tmp_path):
    result = cli("bench")
    assert result.exit_code == 1 and "give a SCENARIO file to run" in result.stderr
    a = write(tmp_path, "{}", "a.json")
    result = cli("bench", write(tmp_path, VALID), "--compare", a, a)
    assert result.exit_code == 1 and "not both" in result.stderr
