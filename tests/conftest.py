"""Shared fixtures: Hugging Face reference checkpoints built from randomised weights."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hf_checkpoints import randomized
from hypothesis import strategies as st

from graphrt.backends.toolchain import missing_for_compile
from graphrt.model.config import PRESETS, Llama3Rope, ModelConfig


def _one_thread_per_worker() -> None:
    """Under `pytest -n` (a worker per core) each worker, and what it starts, computes on one
    thread: two workers of two OpenMP threads each on two cores spin-wait on preempted siblings
    (the same matmul seen 100x slower)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


_one_thread_per_worker()


def _import_what_is_imported_on_first_use() -> None:
    """Import now what torch and transformers would import in the middle of a test: torch._dynamo
    (the first nn.init under a `with torch.device(...)` pulls it in) and transformers' models of
    the three families.
    Each costs about a second, once per process; under `make mutate` each mutant's tests run in
    a process forked after collection, so a lazy import would cost that second per mutant."""
    import torch._dynamo  # noqa: F401

    try:
        import transformers.models.llama.modeling_llama  # noqa: F401
        import transformers.models.qwen2.modeling_qwen2  # noqa: F401
        import transformers.models.qwen3.modeling_qwen3  # noqa: F401
    except ImportError:  # transformers is a test reference only: its tests skip without it
        pass


_import_what_is_imported_on_first_use()


def hf_reference(config: ModelConfig, seed: int = 0):
    """HF's model of `config`'s family (Qwen2ForCausalLM, ...), every parameter randomised
    (biases and norms too: HF's own init leaves them at 0 and 1, which would never exercise them)."""
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.AutoConfig.for_model(**config.to_hf_dict())
    return randomized(transformers.AutoModelForCausalLM.from_config(hf_config).eval(), seed)


def save_reference(config: ModelConfig, directory: Path, seed: int = 0, **save_kwargs):
    model = hf_reference(config, seed)
    model.save_pretrained(directory, **save_kwargs)
    return model


# the text a test tokenizer is trained on
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Graphs replay what eager mode launches.",
          "A decode step is hundreds of tiny kernels;\nthe CPU launches each one.",
          "Über straße, naïve café: ünïcödé too."] * 20


def train_tokenizer():
    """A byte-level BPE (Qwen2's kind of tokenizer) of 400 ids, below `tiny`'s vocabulary of 512."""
    tokenizers = pytest.importorskip("tokenizers")  # a core dependency, but a bare image may lack it
    byte_level = tokenizers.pre_tokenizers.ByteLevel
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = byte_level(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=byte_level.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def pytest_configure(config):
    """Under `make mutate` (mutmut sets MUTANT_UNDER_TEST): in its stats run, credit a shared
    fixture's calls to every test using it; in its coverage run, count every line of a statement
    that ran; in a mutant's run, order its tests so that it dies early, and log its time
    (tests/mutation_plugin.py)."""
    mutant = os.environ.get("MUTANT_UNDER_TEST")
    if mutant is not None:
        from mutation_plugin import plugin_for

        config.pluginmanager.register(plugin_for(mutant), "graphrt-mutation")


# The fixtures that record or launch ranks: each starts processes, so every test using one is slow.
RECORDINGS = {"tiny_torch_recording", "tiny_tp2_traces", "rank_pool"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts processes (marked `processes`, run under `nsys`, or using a recording)
    is slow too: `-m "not slow"` is the inner loop, without ranks, recordings or fresh interpreters.
    (`make mutate` leaves out `processes`, not `slow`: a test slow in-process still kills mutants.)"""
    for item in items:
        starts = item.get_closest_marker("nsys") is not None or not RECORDINGS.isdisjoint(item.fixturenames)
        if item.get_closest_marker("processes") is None and starts:
            item.add_marker(pytest.mark.processes)
        if item.get_closest_marker("processes") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def cpu_unless_marked_cuda(request, monkeypatch):
    """Tests not marked `cuda` run on the CPU wherever they run: on a GPU machine `--device auto`
    (and a scenario's `device = "auto"`) would otherwise pick CUDA, and a figure these tests pin
    down for the CPU (a TapeGraph, bitwise fp32 equality) would be checked against another device.
    Child processes are told the same through CUDA_VISIBLE_DEVICES."""
    if request.node.get_closest_marker("cuda") is None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(autouse=True)
def inductor_toolchain_or_skip(request):
    """Tests marked `inductor` run what torch.compile builds: where this machine lacks its
    compiler or headers they are skipped with the reason, as the device check skips its compile
    step (graphrt.backends.toolchain), instead of failing for the machine's sake."""
    if request.node.get_closest_marker("inductor") is not None:
        device = "cuda" if request.node.get_closest_marker("cuda") is not None else "cpu"
        missing = missing_for_compile(device)
        if missing:
            pytest.skip(f"torch.compile on {device} needs {' and '.join(missing)}")


@pytest.fixture(params=[False, True], ids=["untied", "tied"])
def tiny_config(request) -> ModelConfig:
    """`tiny` (4 query heads, 2 KV heads: GQA groups of 2), with and without tied embeddings."""
    return replace(PRESETS["tiny"], tie_word_embeddings=request.param)


FAMILY_CONFIGS = {
    "qwen2-untied": replace(PRESETS["tiny"], tie_word_embeddings=False),
    "qwen2-tied": replace(PRESETS["tiny"], tie_word_embeddings=True),
    # Qwen3: no q/k/v bias, a norm per head of q and k, head_dim its own field (4 x 32 != 64)
    "qwen3": replace(PRESETS["tiny"], name="tiny-qwen3", model_type="qwen3", head_dim=32),
    # Llama 3: no bias, llama3 rope: with head_dim 16 and theta 1e4 the 8 wavelengths run from
    # 6 to 20,000 positions, so a pretraining context of 64 puts 1 in the kept band, 2 between
    # (interpolated) and 5 in the rescaled one
    "llama3": replace(PRESETS["tiny"], name="tiny-llama3", model_type="llama", rope_theta=10_000.0,
                      tie_word_embeddings=True,
                      rope_scaling=Llama3Rope(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                              original_max_position_embeddings=64)),
}


@pytest.fixture(params=list(FAMILY_CONFIGS))
def family_config(request) -> ModelConfig:
    """A small config of each family: Qwen2 untied and tied, Qwen3, Llama with llama3 rope."""
    return FAMILY_CONFIGS[request.param]


@pytest.fixture
def cli():
    """Invoke `graphrt ...` in-process; returns click's Result (exit_code, stdout, stderr)."""
    from graphrt.cli.main import main

    runner = CliRunner()
    return lambda *args: runner.invoke(main, [str(a) for a in args])


@st.composite
def small_decodes(draw, max_layers: int = 2):
    """(config, batch, prompt_len, seed): a small random Qwen2 shape (GQA groups of 1 to 3,
    head dims 4 to 16) and a decode of it, for property tests of a backend against eager."""
    kv_heads, groups = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 3]))
    head_dim, layers = draw(st.sampled_from([4, 8, 16])), draw(st.integers(1, max_layers))
    heads = kv_heads * groups
    config = ModelConfig("random", vocab_size=97, hidden_size=heads * head_dim, intermediate_size=24,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, rope_theta=10_000.0)
    return (config, draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 9)),
            draw(st.integers(0, 99)))


# `graphrt trace` of tiny on the CPU: 6 decode steps, the first (a quarter of 6, at least 1) a warmup
TINY_TRACE_ARGS = ("--model", "tiny", "--device", "cpu", "--prompt-len", "8", "--steps", "6")
TINY_RECORDED_STEPS = 5
# `graphrt trace --tp 2` of tiny: 4 recorded steps per mode and rank
TP2_STEPS, TP2_WARMUP = 6, 2
ROOT = Path(__file__).resolve().parent.parent


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """The directory `name`, filled by `make` once for the whole test run: by the first pytest
    process to ask for it (one of `pytest -n`'s workers, or the only process), while the others
    wait on its lock and then share it. `make` writes in place, so the paths it prints stay true;
    a directory whose `make` failed is made again by the next to ask."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's own directory, above each worker's
    directory, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # let go when the file closes
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            make(directory)
            done.touch()
    return directory


@pytest.fixture(scope="session")
def tiny_torch_recording(tmp_path_factory) -> tuple[Path, str]:
    """`graphrt trace --profiler torch` of tiny, both modes (eager and graph), recorded once per
    test run: the directory it made and what it printed."""

    def record(out: Path) -> None:
        from graphrt.cli.main import main

        # One thread per recording process: on a loaded machine OpenMP's threads wait on preempted
        # siblings (seen: tiny's packed gate/up matmul at 8.6 ms a call, the eager step at 49 ms, over
        # 100x the replay's), and the replay shrank to a sliver of the step picture's shared time axis.
        with pytest.MonkeyPatch.context() as env:
            env.setenv("OMP_NUM_THREADS", "1")
            result = CliRunner().invoke(main, ["trace", "--profiler", "torch", *TINY_TRACE_ARGS,
                                               "--out", str(out / "traces")])
        assert result.exit_code == 0, result.output
        (out / "printed.txt").write_text(result.output)

    made = made_once(tmp_path_factory, "tiny-torch-traces", record)
    (directory,) = (made / "traces").iterdir()  # and no scratch directory left beside it
    return directory, (made / "printed.txt").read_text()


@pytest.fixture(scope="session")
def tiny_torch_traces(tiny_torch_recording) -> Path:
    """The directory of `tiny_torch_recording` (eager.json, graph.json, summary.json)."""
    return tiny_torch_recording[0]


@pytest.fixture(scope="session")
def tiny_tp2_traces(tmp_path_factory) -> Path:
    """One real two-rank recording (gloo, CPU, torch.profiler) of `graphrt trace --tp 2`, made
    once per test run: the directory holding rank0/ and rank1/. A command of its own, since
    `--tp` starts the ranks by running its command line again."""

    def record(out: Path) -> None:
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        done = subprocess.run(
            [sys.executable, "-m", "graphrt", "trace", "--model", "tiny", "--tp", "2", "--profiler", "torch",
             "--steps", str(TP2_STEPS), "--warmup", str(TP2_WARMUP), "--out", str(out)],
            env={**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": "", "PYTHONFAULTHANDLER": "1"},
            text=True, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr

    (made,) = made_once(tmp_path_factory, "tp2-traces", record).iterdir()
    return made


@pytest.fixture(scope="session")
def rank_pool(tmp_path_factory):
    """The pooled functions of tests/ranks.py, run one after another on one launch of two ranks,
    once per test run (by whichever pytest process asks first; the others share it):
    `rank_pool.results(name)` is what one returned, by rank (tests/rank_pool.py)."""
    import rank_pool  # here, not above: it imports this module's configs

    made = made_once(tmp_path_factory, "rank-pool", rank_pool.make_shared)
    return rank_pool.Pool(made, rank_pool.shared_jobs(made))


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """model_type -> the directory of its tiny seeded checkpoint (tests/hf_checkpoints.py), named
    after it; each is made and saved once per test session, on first use."""
    from hf_checkpoints import save_checkpoint

    root = tmp_path_factory.mktemp("hf-checkpoints")

    def checkpoint(model_type: str) -> Path:
        directory = root / model_type
        return directory if directory.is_dir() else save_checkpoint(model_type, directory)

    return checkpoint
