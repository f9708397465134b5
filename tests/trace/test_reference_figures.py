"""`graphrt analyze` gives, on every real trace the project keeps, the figures it gave before the
readers streamed their input: the reference outputs in tests/data/reference/ were recorded from
the reader that loaded each file whole (`python tests/trace/test_reference_figures.py` records them
again, for a change that means to alter a figure). Each Chrome trace is read gzipped and plain."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

DATA = Path(__file__).parents[1] / "data"
REFERENCE = DATA / "reference"

# case -> the files analysed together, relative to tests/data
CASES = {
    "v100-graph-launches": ["torch/hta-v100-graph-launches.json.gz"],
    "a100-alexnet-eager": ["torch/hta-a100-alexnet-eager.json.gz"],
    "h100-2gpu-nsys": ["nsys/nsysai-h100-2gpu-nsys2026.2.sqlite"],
    "saxpy-mpi-nsys": ["nsys/pipit-saxpy-mpi-cuda-nsys2022.2.sqlite"],
    "both-torch": ["torch/hta-a100-alexnet-eager.json.gz", "torch/hta-v100-graph-launches.json.gz"],
    "both-nsys": ["nsys/pipit-saxpy-mpi-cuda-nsys2022.2.sqlite", "nsys/nsysai-h100-2gpu-nsys2026.2.sqlite"],
    # graphrt trace --profiler torch --model tiny: eager and graph on a CPU, summary.json beside
    "tiny-cpu-eager-graph": ["reference/tiny-cpu/eager.json.gz", "reference/tiny-cpu/graph.json.gz"],
}


def analyze_output(files: list[Path], out: Path) -> tuple[str, dict]:
    """(what `graphrt analyze FILES --json OUT` prints, what it writes), each file's path
    replaced by its name so that the same traces read from elsewhere compare equal."""
    from graphrt.cli.main import main

    result = CliRunner().invoke(main, ["analyze", *map(str, files), "--json", str(out)])
    assert result.exit_code == 0, result.output
    text, written = result.stdout, out.read_text()
    for f in files:
        text, written = text.replace(str(f), f.name), written.replace(json.dumps(str(f))[1:-1], f.name)
    text = text.replace(str(out), out.name)
    return text, json.loads(written)


def _plain_copies(files: list[Path], tmp_path: Path) -> list[Path]:
    """The files with every gzipped one inflated, under the same names (the readers tell a gzip
    by its content, not its name), beside a copy of what lay beside them."""
    copies = []
    for f in files:
        directory = tmp_path / f.parent.name
        directory.mkdir(exist_ok=True)
        for beside in f.parent.glob("summary.json"):
            shutil.copy(beside, directory)
        copy = directory / f.name
        copy.write_bytes(gzip.decompress(f.read_bytes()) if f.read_bytes()[:2] == b"\x1f\x8b" else f.read_bytes())
        copies.append(copy)
    return copies


@pytest.mark.parametrize("form", ["as kept", "inflated"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_real_trace_gives_the_recorded_figures(case, form, tmp_path):
    files = [DATA / f for f in CASES[case]]
    if form == "inflated":
        if not any(f.name.endswith(".gz") for f in files):
            pytest.skip("no gzipped file in this case")
        files = _plain_copies(files, tmp_path)
    text, figures = analyze_output(files, tmp_path / "figures.json")
    assert figures == json.loads((REFERENCE / f"{case}.json").read_text())
    assert text == (REFERENCE / f"{case}.txt").read_text()


def record() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for case, names in CASES.items():
            text, figures = analyze_output([DATA / n for n in names], Path(tmp) / "figures.json")
            (REFERENCE / f"{case}.json").write_text(json.dumps(figures, indent=1) + "\n")
            (REFERENCE / f"{case}.txt").write_text(text)
            print(f"recorded {case}", file=sys.stderr)


if __name__ == "__main__":
    record()
