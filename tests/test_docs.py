"""Every command the README and docs/ show runs, and prints what they show; every link leads somewhere.

A page's commands run in order in one working directory that holds the repository's `scenarios/`,
`scripts/` and `tests/`, so a later command reads what an earlier one wrote: a path with a `<...>`
in it (`traces/<time>-qwen2-0.5b-both`) is the newest that matches. They run on the tiny model:
`qwen2-0.5b` reads `tiny`, a `graphrt run`, `trace` or `plan` that names no model gets `--model
tiny`, and `./Qwen2-0.5B` is a tiny HF checkpoint with a tokenizer. A few run on less than shown
(`SMALLER`, each with its reason). `make` commands run dry (`make -n`), and what they would run is
run: `graphrt` as above, pytest collecting the tests it would run. A `graphrt` command runs in this
interpreter, through click's runner, as in the other command tests; `python`, `torchrun` and a
`graphrt --tp` (whose ranks run the command line it was started with) each run in a fresh one. A command CI runs through make
(`.ci/run`) counts as run. A command whose comment says "GPU only" is left to the reader, as are
those `NOT_RUN` names with the reason; one on fetched data (`tests/data/engines/`, or the shared fixtures' `engines/`) runs where it is.

Where a page shows what a command prints (`$ command`, the lines under it), the real output must
have each table's columns, in order, and each labelled line up to its first figure; where a page
says which fields `--json` holds, the JSON its command wrote must hold every one.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys
import traceback
from pathlib import Path

import engine_traces
import pytest
import torch
from click.testing import CliRunner
from docs_pages import PAGES, ROOT, Example, examples, headings, json_fields, labelled_lines, links, table_headers


# A command shown -> what runs instead, and why: the same command on less.
SMALLER = {
    "graphrt bench peer": ("graphrt bench peer --max-points 1 --repeats 1", "its second model is qwen2-0.5b"),
    "python scripts/bench_trace.py --copies 4,16": (
        "python scripts/bench_trace.py --copies 1 --repeats 1 --ranks 2 --rank-copies 1", "16x is 466 MB"),
    "python scripts/bench_trace.py --copies 1,16 --gzip --ranks 0": (
        "python scripts/bench_trace.py --copies 1 --repeats 1 --gzip --ranks 0", "16x is 466 MB"),
    "python scripts/bench_trace.py --copies 16,64 --repeats 1 --ranks 0": (
        "python scripts/bench_trace.py --copies 2 --repeats 1 --ranks 0", "64x is 1.9 GB"),
}
# A command shown -> why no test can run it.
NOT_RUN = {
    "make mutate MODULE=graphrt/measure/timing.py": "a mutation run: minutes, and mutmut installed",
    "make mutate": "the whole core's mutation run: 16 minutes",
    ".venv/bin/mutmut results": "reads a mutation run's results",
    ".venv/bin/mutmut show graphrt.measure.timing.x_percentile__mutmut_3": "reads a mutation run's results",
    "graphrt analyze vllm-trace.json.gz": "the reader's own engine trace",
}
# A command shown on an engine's trace -> the folder of tests/data/engines its files are in.
FETCHED = {"graphrt analyze sglang_Qwen3-8B_decode.json.gz capture_traces/bs_32_rank0.json.gz": "sglang_decode"}
PRESETS_THAT_MAKE_A_MODEL = {"run", "trace", "plan"}


def left_to_the_reader(example: Example) -> bool:
    return example.gpu_only or example.command in NOT_RUN


def ci_commands() -> list[str]:
    """What CI runs: `.ci/run`'s lines, and what each `make` target it calls would run."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    ran = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    for line in ran[:]:
        if line.startswith("make "):
            ran += dry_run(shlex.split(line)[1:]).splitlines()
    return ran


def dry_run(make_args: list[str]) -> str:
    done = subprocess.run(["make", "-n", *make_args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"make {' '.join(make_args)}: {done.stderr.strip()}"
    return done.stdout


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A HF directory of the tiny model with a tokenizer: what `./Qwen2-0.5B` stands for."""
    pytest.importorskip("transformers")
    from conftest import save_reference, train_tokenizer

    from graphrt.model.config import PRESETS
    from graphrt.run.text import TOKENIZER_FILE

    directory = tmp_path_factory.mktemp("Qwen2-0.5B")
    save_reference(PRESETS["tiny"], directory)
    train_tokenizer().save(str(directory / TOKENIZER_FILE))
    return directory


class Session:
    """A page's working directory, where its commands run one after another."""

    def __init__(self, cwd: Path, checkpoint: Path | None):
        self.cwd, self.checkpoint = cwd, checkpoint
        for name in ("scenarios", "scripts", "tests"):
            (cwd / name).symlink_to(ROOT / name)

    def here(self, words: list[str]) -> list[str]:
        """The words of a command as they run here (see the module's docstring)."""
        words = [self.resolve(w.replace("qwen2-0.5b", "tiny")) for w in words]
        if words[:1] == ["graphrt"] and words[1:2] and words[1] in PRESETS_THAT_MAKE_A_MODEL and "--model" not in words:
            words += ["--model", "tiny"]
        return words

    def argv(self, words: list[str]) -> list[str]:
        """The command as a fresh process runs it."""
        words = self.here(words)
        program = {"graphrt": [sys.executable, "-m", "graphrt"], "python": [sys.executable],
                   "torchrun": [sys.executable, "-m", "torch.distributed.run"]}.get(words[0], words[:1])
        return program + words[1:]

    def resolve(self, word: str) -> str:
        if word == "./Qwen2-0.5B":
            if self.checkpoint is None:
                pytest.skip("transformers makes the tiny checkpoint that stands for ./Qwen2-0.5B")
            return str(self.checkpoint)
        if "<" not in word:
            return word
        pattern = re.sub(r"<[^>]*>", "*", word)
        matches = sorted(glob.glob(pattern, root_dir=self.cwd), key=lambda p: (self.cwd / p).stat().st_mtime)
        assert matches, f"nothing here matches {word} (made by an earlier command on the page?)"
        return matches[-1]

    def run(self, command: str, where: str, data: Path | None = None) -> str:
        """Run a command shown; `data`, a folder its files are read from."""
        words = [str(data / w) if data and (data / w).exists() else w for w in shlex.split(command)]
        env = {"OMP_NUM_THREADS": "1"}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        # --tp's ranks run the command line their process was started with: a process of its own
        if words[0] == "graphrt" and not any(w == "--tp" or w.startswith("--tp=") for w in words):
            code, output = self.run_here(self.here(words)[1:], env)
        else:
            done = subprocess.run(self.argv(words), cwd=self.cwd, env={**os.environ, **env}, capture_output=True,
                                  text=True, timeout=600)
            code, output = done.returncode, done.stdout + done.stderr
        assert code == 0, f"{where}: `{command}` exited {code}:\n{output[-3000:]}"
        return output

    def run_here(self, args: list[str], env: dict[str, str]) -> tuple[int, str]:
        """`graphrt ARGS` in this interpreter, as the shell would run it: in the page's directory,
        with its variables (OMP_NUM_THREADS sets torch's threads, as at an interpreter's start).
        What it starts (a process per mode or rank) starts as from the command line."""
        from graphrt.cli.main import main

        threads = torch.get_num_threads()
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(self.cwd)
            for name, value in env.items():
                patch.setenv(name, value)
            torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
            try:
                result = CliRunner().invoke(main, args)
            finally:
                torch.set_num_threads(threads)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            return 1, result.output + "".join(traceback.format_exception(result.exception))
        return result.exit_code, result.output

    def run_make(self, command: str, where: str) -> str:
        """`make X ...` dry, then what it would run: graphrt commands as any other, pytest collecting."""
        would = dry_run(shlex.split(command)[1:]).splitlines()
        output = ""
        for line in would:
            if re.search(r"(^|/)graphrt ", line):
                output += self.run(re.sub(r"^\S*/graphrt ", "graphrt ", line.strip()), where)
            elif " -m pytest " in line:
                args = [a for a in shlex.split(line.split(" -m pytest ", 1)[1]) if a != "-q"]
                done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], cwd=ROOT,
                                      capture_output=True, text=True, timeout=600)
                assert done.returncode == 0 and re.search(r"\d+ tests? collected", done.stdout), \
                    f"{where}: `{command}` would run pytest {' '.join(args)}, which collects nothing:\n{done.stdout[-2000:]}"
        assert output or any(" -m pytest " in line for line in would), f"{where}: `{command}` runs neither graphrt nor pytest"
        return output


def runnable(page: Path) -> list[Example]:
    return [e for e in examples(page) if not left_to_the_reader(e)]


def json_keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in json_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in json_keys(v)}
    return set()


def check_shown(example: Example, output: str) -> None:
    printed = [" ".join(line.split()) for line in output.splitlines()]
    headers = [re.split(r"\s{2,}", line.strip()) for line in output.splitlines()]
    for columns in table_headers(example.shown):
        assert any(_in_order(columns, header) for header in headers), \
            f"{example.where}: no table printed has the columns shown: {columns}"
    for label, inside in labelled_lines(example.shown):
        assert any(label in line if inside else line.startswith(label) for line in printed), \
            f"{example.where}: no line printed {'holds' if inside else 'begins'} `{label}`"


def _in_order(wanted: list[str], have: list[str]) -> bool:
    remaining = iter(have)
    return all(any(column == h for h in remaining) for column in wanted)


RUN_PAGES = [page for page in PAGES if runnable(page)]


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUN_PAGES])
def test_every_command_a_page_shows_runs_and_prints_what_it_shows(page, tmp_path, request):
    checkpoint = request.getfixturevalue("checkpoint") if "./Qwen2-0.5B" in page.read_text() else None
    session, ci = Session(tmp_path, checkpoint), ci_commands()
    for example in runnable(page):
        shown = example.command
        if shown in ci or any(line.endswith(shown) for line in ci):
            continue
        if shown.startswith("make "):
            output = session.run_make(shown, example.where)
        elif shown in FETCHED:
            folder = next((place / FETCHED[shown] for place in engine_traces.PLACES
                           if (place / FETCHED[shown]).is_dir()), None)
            if folder is None:
                continue  # not here: tests/trace/test_engine_steps.py skips on it too
            output = session.run(shown, example.where, data=folder)
        else:
            output = session.run(SMALLER.get(shown, (shown,))[0], example.where)
        check_shown(example, output)
    if fields := json_fields(page):
        words = shlex.split([e.command for e in runnable(page) if "--json" in e.command][-1])
        path = tmp_path / words[words.index("--json") + 1]
        missing = set(fields) - json_keys(json.loads(path.read_text()))
        assert not missing, f"{page.relative_to(ROOT)} says `--json` holds {sorted(missing)}; {path.name} does not"


def test_each_command_run_another_way_is_still_shown():
    shown = {e.command for page in PAGES for e in examples(page)}
    stale = (set(SMALLER) | set(FETCHED) | set(NOT_RUN)) - shown
    assert not stale, f"tests/test_docs.py runs commands no page shows any more: {sorted(stale)}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_leads_to_a_page_and_heading_that_exist(page):
    broken = []
    for line, target in links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{page.relative_to(ROOT)}:{line}: {target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in headings(destination):
            broken.append(f"{page.relative_to(ROOT)}:{line}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def test_every_page_of_the_manual_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in links(ROOT / "README.md")}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"README.md links no {unlinked}"


def test_the_readme_stays_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
