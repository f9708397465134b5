"""The device check's prerequisites: one line for each, and a missing one skips only its steps.

The device machine has no network and lacks packages graphrt needs; the check must say what is
missing and go on with what can run, never crash as a whole. (The whole check is rehearsed on the
CPU by `scripts/gpu_check.sh --rehearse`, which CI runs.)
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PREREQS = REPO / "scripts" / "gpu_prereqs.py"


def _prereqs(tmp_path, device, *absent):
    """Run the prerequisite check with `absent` modules failing to import, as if not installed."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    for module in absent:
        (blocked / f"{module}.py").write_text("raise ImportError('not installed')\n")
    shell = tmp_path / "have.sh"
    done = subprocess.run([sys.executable, str(PREREQS), "--device", device, str(shell)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(blocked)})
    have = dict(line.split("=") for line in shell.read_text().split()) if shell.exists() else {}
    return done, have


@pytest.mark.processes
def test_everything_present_is_one_ok_line_each(tmp_path):
    done, have = _prereqs(tmp_path, "cpu")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(line.startswith("prereq: ok ") for line in lines), lines
    assert any("nvtx" in line for line in lines) and any("pytest" in line for line in lines)
    assert have["have_graphrt"] == have["have_tests"] == have["have_plot"] == have["have_hf"] == "1"


@pytest.mark.processes
def test_a_missing_package_is_named_with_the_steps_it_skips(tmp_path):
    done, have = _prereqs(tmp_path, "cpu", "nvtx", "hypothesis")
    assert done.returncode == 0, done.stderr
    assert "prereq: MISSING nvtx: skipping every graphrt step" in done.stdout
    assert "prereq: MISSING hypothesis: skipping the CUDA tests" in done.stdout
    # without graphrt's own dependencies neither the tests nor compile can run; plots still could
    assert (have["have_graphrt"], have["have_tests"], have["have_compile"], have["have_plot"]) == ("0", "0", "0", "1")
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.processes
def test_no_cuda_device_stops_the_check_with_one_line_for_it(tmp_path):
    done, have = _prereqs(tmp_path, "cuda")
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 1 and have == {}
    assert lines[0].startswith("prereq: MISSING a CUDA device"), lines
    assert any(line.startswith("prereq: ok nvtx") for line in lines), lines  # the rest still looked at
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.processes
def test_without_torch_every_other_missing_package_is_named_too(tmp_path):
    # the check stops, but one look at the machine must find all it lacks, not the first of them
    done, have = _prereqs(tmp_path, "cpu", "torch", "nvtx", "hypothesis")
    assert done.returncode == 1 and have == {}
    assert "prereq: MISSING torch: nothing can run" in done.stdout
    assert "prereq: MISSING nvtx: skipping every graphrt step" in done.stdout
    assert "prereq: MISSING hypothesis: skipping the CUDA tests" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.processes
def test_a_torch_older_than_graphrts_floor_stops_the_check_with_one_line_naming_both(tmp_path):
    # the checkout runs from PYTHONPATH, so no pip ever held the device's torch to setup.cfg's floor
    older = tmp_path / "older"
    (older / "torch").mkdir(parents=True)
    (older / "torch" / "__init__.py").write_text("")
    (older / "torch-2.4.1.dist-info").mkdir()
    (older / "torch-2.4.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.4.1\n")
    shell = tmp_path / "have.sh"
    done = subprocess.run([sys.executable, str(PREREQS), "--device", "cpu", str(shell)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(older)})
    import re

    assert done.returncode == 1 and not shell.exists()
    assert re.search(r"^prereq: MISSING torch >= 2\.\d+ \(this is torch 2\.4\.1, older than graphrt runs on\): "
                     r"nothing can run$", done.stdout, re.M), done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def _older_transformers(tmp_path) -> Path:
    """A folder for PYTHONPATH holding a transformers 5.17.0, the device image's."""
    older = tmp_path / "older"
    (older / "transformers").mkdir(parents=True)
    (older / "transformers" / "__init__.py").write_text("")
    (older / "transformers-5.17.0.dist-info").mkdir()
    (older / "transformers-5.17.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: transformers\nVersion: 5.17.0\n")
    return older


@pytest.mark.processes
def test_a_transformers_older_than_the_hf_floor_skips_only_the_transformers_step(tmp_path):
    # 5.17 names the cache past_key_values: graphrt's `cache=` would leave its StaticCache unused
    shell = tmp_path / "have.sh"
    done = subprocess.run([sys.executable, str(PREREQS), "--device", "cpu", str(shell)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(_older_transformers(tmp_path))})
    assert done.returncode == 0, done.stderr
    assert ("prereq: MISSING transformers >= 5.24 (this is 5.17.0): skipping the transformers-backed model's run"
            in done.stdout.splitlines()), done.stdout
    have = dict(line.split("=") for line in shell.read_text().split())
    assert (have["have_hf"], have["have_graphrt"], have["have_tests"]) == ("0", "1", "1")


@pytest.mark.processes
def test_the_check_takes_transformers_from_its_wheels_only_where_the_one_there_is_below_the_floor(tmp_path):
    def meets(pythonpath: str) -> int:
        return subprocess.run([sys.executable, str(PREREQS), "--meets-floor", "transformers"], capture_output=True,
                              env={**os.environ, "PYTHONPATH": pythonpath}).returncode

    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "transformers.py").write_text("raise ImportError('not installed')\n")
    assert meets("") == 0  # this environment's, graphrt's pin
    assert meets(str(_older_transformers(tmp_path))) == 1
    assert meets(str(blocked)) == 1


@pytest.mark.processes
@pytest.mark.slow
def test_the_transformers_step_decodes_a_mistral_made_on_the_spot_and_the_summary_shows_it(tmp_path):
    # the step as gpu_check.sh runs it (its command line read from the script), on the CPU
    import json
    import re
    import shlex

    pytest.importorskip("transformers")
    line = re.search(r"^step run-hf .*$", CHECK.replace("\\\n", " "), re.M).group()
    raw, work = tmp_path / "work" / "raw", tmp_path / "work"
    raw.mkdir(parents=True)
    values = {"$py": sys.executable, "$work": str(work), "$raw": str(raw), "$device": "cpu", "$dtype": "float32"}
    argv = []
    for word in shlex.split(line)[3:]:  # after `step run-hf "$have_hf"`
        if word == "${graphrt[@]}":
            argv += [sys.executable, "-m", "graphrt"]
            continue
        for name, value in values.items():
            word = word.replace(name, value)
        argv.append(word)
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads((raw / "run-hf.json").read_text())
    assert run["implementation"] == "transformers" and run["refused"] == {}
    assert run["modes"]["graph"]["equivalence"]["identical"] is True
    assert run["modes"]["piecewise"]["equivalence"]["identical"] is True  # its graphs between attention modules
    (work / "outcomes.txt").write_text("run-hf=14|ok 9s\n")
    summary = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_summary.py"), str(tmp_path), str(work)],
                             cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert summary.returncode == 0, summary.stdout + summary.stderr
    rows = json.loads((tmp_path / "gpu-summary.json").read_text())["runs"]
    assert [(r["mode"], r["tokens_identical"], r["achieved_GBps"]) for r in rows] == [
        ("eager", None, None), ("piecewise", True, None), ("graph", True, None)]


@pytest.mark.processes
def test_wheels_are_unpacked_for_this_interpreter_without_pip(tmp_path):
    import platform
    import zipfile

    wheels, site = tmp_path / "whl", tmp_path / "site"
    wheels.mkdir()
    minor, machine = sys.version_info.minor, platform.machine()
    made = {  # file name -> the module it holds
        f"demo-1.0-cp3{minor + 1}-cp3{minor + 1}-manylinux_2_17_{machine}.whl": "wrong_python",
        f"demo-1.0-cp3{minor}-cp3{minor}-win_amd64.whl": "wrong_platform",
        f"demo-1.0-cp3{minor}-cp3{minor}-manylinux_2_17_{machine}.manylinux2014_{machine}.whl": "demo",
        f"stable-2.0-cp3{minor - 1}-abi3-manylinux_2_17_{machine}.whl": "stable",
    }
    for name, module in made.items():
        with zipfile.ZipFile(wheels / name, "w") as archive:
            archive.writestr(f"{module}/__init__.py", f"NAME = {module!r}\n")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "install_wheels.py"), str(wheels),
                           str(site), "demo", "stable", "absent"], capture_output=True, text=True)
    assert done.returncode == 1  # "absent" has no wheel
    assert sorted(p.name for p in site.iterdir()) == ["demo", "stable"]
    assert "no wheel of absent" in done.stdout and "run scripts/gpu_bundle.sh" in done.stdout


# -- the plan: what the check runs, in what time ------------------------------------------------

CHECK = (REPO / "scripts" / "gpu_check.sh").read_text()


def _setting(name: str) -> int:
    import re

    return int(re.search(rf"^{name}=(\d+)", CHECK, re.M).group(1))


def _plan() -> tuple[int, list[str], dict[str, int]]:
    """The check's budget, its steps in order, and each step's planned limit, as the script says."""
    import re

    order = re.search(r"^PLAN=\(([^)]*)\)", CHECK, re.M).group(1).split()
    limits = {name: int(s) for name, s in re.findall(r"^limit\[([\w-]+)\]=(\d+)", CHECK, re.M)}
    return _setting("BUDGET"), order, limits


def test_the_steps_limits_fit_the_budget_with_room_for_set_up_kill_grace_and_summary():
    budget, order, limits = _plan()
    assert budget <= 330  # a device session is 15 minutes, its start and a second try included
    assert set(order) == set(limits)
    assert _setting("GRACE") <= 5  # seconds, not ten: a cut step's SIGKILL comes soon after its SIGINT
    assert sum(limits.values()) <= budget - _setting("SETUP") - _setting("RESERVE") - _setting("GRACE")


def test_every_step_the_check_runs_has_a_planned_limit_and_runs_in_plan_order():
    import re

    _, order, _ = _plan()
    run = re.findall(r"^\s*step ([\w-]+) ", CHECK, re.M)
    assert run == order


@pytest.mark.processes
def test_the_probe_times_before_any_profiler_session_then_profiles_two_sessions(tmp_path):
    # CUPTI's tax and its second-session bug both depend on what opened before: the "before"
    # timing must see no session, each replay check must be its own session, in order
    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_probe.py"), "--model", "tiny",
                           "--device", "cpu", "--steps", "6", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    import json

    facts = json.loads(out.read_text())
    assert facts["timing"]["before"]["sessions_opened"] == 0
    assert (facts["replay"]["profiler_session"], facts["second_session"]["profiler_session"]) == (1, 2)
    assert facts["timing"]["after"]["sessions_opened"] == 2
    assert set(facts["profiler_tax"]) == {"eager", "graph"}


# -- the check as it runs: within its budget, its results brought back whatever cuts it ------------

def _rehearse(budget: int, python: str = sys.executable, **where: str) -> subprocess.Popen:
    """The rehearsal of the check with `python` (this interpreter: every package there), in its
    own process group, its results where `where` (RESULTS=..., or OUT=...) says."""
    env = {k: v for k, v in os.environ.items() if k not in ("RESULTS", "OUT")}
    env.update(where, GPU_CHECK_BUDGET=str(budget), REHEARSAL_PYTHON=python, OMP_NUM_THREADS="1")
    return subprocess.Popen(["scripts/gpu_check.sh", "--rehearse"], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _packed(results: Path) -> set[str]:
    import tarfile

    with tarfile.open(results / "raw.tar.gz") as archive:
        return {Path(name).name for name in archive.getnames()} - {"."}


STEP_FILES = {"run-b1": "run-b1.json", "run-qwen3-b1": "run-qwen3-b1.json", "compile-b1": "compile-b1.json",
              "cuda-tests": "cuda-tests.xml", "probe": "probe.json", "analyze": "analysis.json",
              "localize": "localize.json", "tp1": "tp1.json"}


@pytest.mark.processes
def test_a_budget_too_small_for_the_steps_ends_within_it_with_the_summary_and_every_finished_steps_files(tmp_path):
    import json
    import time

    # the third step hangs and ignores SIGINT, as a wedged CUDA call may: only the kill ends it,
    # and it must come early enough to leave the summary its time
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
case "$*" in *run-qwen3-b1.json*) trap '' INT; exec sleep 600;; esac
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    results = tmp_path / "results"
    budget = 36  # the steps before the hung one take ~5 s on an idle machine, ~15 s on a busy one
    start = time.monotonic()
    check = _rehearse(budget, str(python), RESULTS=str(results))
    log, _ = check.communicate(timeout=budget + 60)
    took = time.monotonic() - start
    assert took <= budget + 3, f"{took:.0f}s for a budget of {budget}s\n{log}"
    assert check.returncode == 1  # steps were cut or skipped: not a pass
    steps = {s["step"]: s["outcome"] for s in json.loads((results / "gpu-summary.json").read_text())["steps"]}
    assert steps["run-qwen3-b1"].startswith("TIMEOUT"), steps
    finished = {name for name, outcome in steps.items() if outcome.startswith("ok")}
    assert {"info", "run-b1"} <= finished, steps
    assert {STEP_FILES[name] for name in finished if name in STEP_FILES} <= _packed(results)


@pytest.mark.processes
def test_a_check_killed_from_outside_has_already_brought_back_every_finished_step_into_out(tmp_path):
    # the device machine's own limit kills the whole check, its summary unwritten: what finished
    # before is in the results already; RESULTS unset, they go to $OUT
    import signal

    check, lines = _rehearse(300, OUT=str(tmp_path)), []
    try:
        for line in check.stdout:
            lines.append(line)
            if line.startswith("== run-b1: "):
                break
        os.killpg(check.pid, signal.SIGKILL)
    finally:
        check.wait(timeout=30)
    assert lines and lines[-1].startswith("== run-b1: ok"), "".join(lines)
    assert not (tmp_path / "gpu-summary.json").exists()
    assert "run-b1.json" in _packed(tmp_path)
