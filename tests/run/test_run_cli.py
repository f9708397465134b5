"""`graphrt run`: its JSON can be checked against HF, and bad input gets one clear line."""

import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import one_line_error
import torch
from conftest import save_reference

from graphrt.model.config import PRESETS

ROOT = Path(__file__).resolve().parents[2]


def test_greedy_tokens_equal_hf_generate(cli, family_config, tmp_path):
    # a directory HF saved (its own config.json form) runs as it is, for every family
    hf = save_reference(family_config, tmp_path / "ckpt")
    out = tmp_path / "run.json"
    result = cli("run", "--model", tmp_path / "ckpt", "--batch", 2, "--prompt-len", 5,
                 "--steps", 12, "--mode", "eager", "--json", out)
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())
    prompt = torch.tensor(run["prompt_ids"])
    assert prompt.shape == (2, 5) and not torch.equal(prompt[0], prompt[1])
    expected = hf.generate(prompt, max_new_tokens=13, do_sample=False, attention_mask=torch.ones_like(prompt))
    assert run["modes"]["eager"]["generated_ids"] == expected[:, 5:].tolist()


def test_table_shows_each_modes_figures_from_its_samples(cli, tmp_path):
    out = tmp_path / "run.json"
    result = cli("run", "--model", "tiny", "--steps", 6, "--warmup", 2, "--json", out)
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())
    lines = result.stdout.splitlines()
    header, columns, rule, *rows = lines[:5]
    assert header == (f"tiny · {run['machine']['device_name']} (cpu) · float32 · batch 1 · "
                      "prompt 16 · 6 steps (2 warmup, not timed) · cache 22 positions")
    assert re.split(r"\s{2,}", columns.strip())[:6] == ["mode", "step ms (median)", "p10", "p90",
                                                         "tokens/s", "GB/s"]
    for row, mode in zip(rows, ["eager", "graph"]):
        name, median, p10, p90, tokens_per_s, gb_per_s, *_ = row.split()
        figures = run["modes"][mode]
        samples = figures["samples_ms"]
        assert name == mode and len(samples) == 4  # 6 steps, the first 2 not timed
        deciles = statistics.quantiles(samples, n=10, method="inclusive")
        assert median == f"{statistics.median(samples):.3f}"
        assert (p10, p90) == (f"{deciles[0]:.3f}", f"{deciles[-1]:.3f}")
        assert tokens_per_s == f"{1e3 / statistics.median(samples):.3f}"
        assert gb_per_s == f"{figures['achieved_bandwidth'] / 1e9:.3f}"
    # the second table: the work one step issued
    ops_at = lines.index(next(line for line in lines if line.split() == ["mode", "aten", "ops/step"]))
    ops = dict(line.split() for line in lines[ops_at + 2: ops_at + 4])
    assert ops == {mode: str(run["modes"][mode]["ops_per_step"]) for mode in ("eager", "graph")}
    assert int(ops["eager"]) > 0


def test_the_ops_table_shows_hfs_step_on_the_same_config_and_weights(cli, tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "run.json"
    result = cli("run", "--model", "tiny", "--steps", 4, "--mode", "eager", "--json", out)
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())
    row = next(line for line in result.stdout.splitlines() if line.startswith("hf eager "))
    assert int(row.split()[-1]) == run["hf_ops_per_step"]
    # counted the same way, graphrt's lean step issues fewer ops than HF's
    assert 0 < run["modes"]["eager"]["ops_per_step"] < run["hf_ops_per_step"]


def test_without_transformers_the_table_says_why_hf_has_no_row(cli, monkeypatch):
    from graphrt.backends import peer

    monkeypatch.setattr(peer, "unavailable", lambda: "transformers is not installed")
    result = cli("run", "--model", "tiny", "--steps", 4, "--mode", "eager")
    assert result.exit_code == 0, result.output
    assert "(no hf eager row: transformers is not installed)" in result.stdout.splitlines()
    assert not any(line.startswith("hf eager ") for line in result.stdout.splitlines())


def test_a_comma_list_runs_those_modes_in_order(cli):
    result = cli("run", "--model", "tiny", "--steps", 4, "--mode", "eager,piecewise")
    assert result.exit_code == 0, result.output
    rows = [line.split()[0] for line in result.stdout.splitlines()[3:5]]
    assert rows == ["eager", "piecewise"]
    assert "piecewise vs eager: tokens identical; max |Δ logits| 0 over 4 steps" in result.stdout


@pytest.mark.parametrize("args, fragments", [
    (["--model", "no/such/dir"], ["no/such/dir: no such model directory"]),
    (["--model", "qwen9"], ["unknown model 'qwen9'", "tiny"]),
    (["--batch", "0"], ["--batch must be a positive integer, got 0"]),
    (["--steps", "-1"], ["--steps must be a positive integer, got -1"]),
    (["--prompt-len", "0"], ["--prompt-len must be a positive integer, got 0"]),
    (["--prompt-len", "30", "--steps", "10", "--max-seq-len", "32"],
     ["--prompt-len 30 + --steps 10 = 40 exceeds --max-seq-len 32"]),
    (["--dtype", "int8"], ["--dtype must be auto or one of float32, bfloat16, float16, got 'int8'"]),
    (["--mode", "warp"], ["--mode must be one of eager, piecewise, graph, compile, both, all or a comma list",
                          "'warp'"]),
    (["--mode", "eager,eager"], ["comma list of distinct modes", "'eager,eager'"]),
])
def test_bad_options(cli, args, fragments):
    one_line_error(cli("run", "--model", "tiny", *args), *fragments)


def test_non_integer_option_is_a_usage_error_on_one_line(cli):
    one_line_error(cli("run", "--batch", "two"), "'--batch'", "two", code=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is absent")
def test_cuda_without_cuda(cli):
    one_line_error(cli("run", "--model", "tiny", "--device", "cuda"), "CUDA is not available")


def test_directory_without_config(cli, tmp_path):
    one_line_error(cli("run", "--model", tmp_path), f"{tmp_path}: no config.json")


def test_invalid_config_json(cli, tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    one_line_error(cli("run", "--model", tmp_path), "config.json: invalid JSON")


def test_config_missing_a_field(cli, tmp_path):
    cfg = PRESETS["tiny"].to_hf_dict()
    del cfg["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    one_line_error(cli("run", "--model", tmp_path), "missing field(s) intermediate_size")


def test_checkpoint_with_a_misshaped_tensor(cli, tmp_path):
    from safetensors.torch import load_file, save_file

    save_reference(PRESETS["tiny"], tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(63)
    save_file(tensors, tmp_path / "model.safetensors")
    one_line_error(cli("run", "--model", tmp_path),
                   "tensor model.layers.0.self_attn.q_proj.bias has shape (63,), expected (64,)")


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Writes past `nbytes` into any file fail with EFBIG, for root too (Python ignores the
    SIGXFSZ the kernel sends, so the write returns an error instead)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_write_that_fails_midway_keeps_the_old_file(cli, tmp_path):
    # the run's JSON is several KiB; the write of its temporary file fails after 64 bytes
    out = tmp_path / "run.json"
    out.write_text("previous")
    with file_size_limit(64):
        result = cli("run", "--model", "tiny", "--steps", 4, "--mode", "eager", "--json", out)
    assert result.exit_code == 1, result.output
    # after the run's progress lines, one line says why the result was not written
    assert result.stderr.splitlines()[-1] == f"error: {out}: cannot write here (File too large)"
    assert "Traceback" not in result.output
    assert out.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary file left


def test_json_into_a_path_that_is_a_file(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    one_line_error(cli("run", "--model", "tiny", "--steps", 4, "--json", blocker / "run.json"),
                   "cannot write")


@pytest.mark.processes
def test_a_run_prints_no_third_party_warning(tmp_path):
    # a fresh process, so that warnings raised while torch and friends import are seen too
    # It runs in the repository root and imports this checkout's graphrt: under `make mutate`,
    # the mutated copy, whose function wrappers read their config from setup.cfg there.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "graphrt", "run", "--model", "tiny", "--steps", "3",
                           "--mode", "piecewise"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["running piecewise…"]
    assert any(line.startswith("piecewise ") for line in proc.stdout.splitlines())


def test_json_onto_a_directory_is_refused_before_the_run(cli, tmp_path):
    out = tmp_path / "run.json"
    (out / "inside").mkdir(parents=True)  # a directory where the file is expected
    result = cli("run", "--model", "tiny", "--steps", 4, "--mode", "eager", "--json", out)
    one_line_error(result, f"File '{out}' is a directory", code=2)
    assert [p.name for p in out.iterdir()] == ["inside"]


def test_a_path_under_a_file_is_refused_before_the_run_naming_the_file(cli, tmp_path):
    (tmp_path / "notes").write_text("a file, not a folder")
    out = tmp_path / "notes" / "run.json"
    result = cli("run", "--model", "tiny", "--steps", 4, "--mode", "eager", "--json", out)
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {out}: cannot write here ({tmp_path / 'notes'} is a file, not a folder)"
