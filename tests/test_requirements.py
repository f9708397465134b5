"""The requirements setup.cfg states are true of the code: the torch floor is the oldest release
with every torch API graphrt calls."""

import importlib.util
import operator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# the torch APIs graphrt calls that became public latest, and the release that made each public
# (read in that release's sources; the release before it has only the private spelling)
NEWEST_APIS = {"nn.Module.register_load_state_dict_pre_hook": (2, 5)}


def _floor() -> tuple[int, ...]:
    """setup.cfg's floor, as the device check reads it."""
    spec = importlib.util.spec_from_file_location("gpu_prereqs", REPO / "scripts" / "gpu_prereqs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.torch_floor()


def test_the_torch_floor_is_the_release_that_made_the_newest_api_graphrt_calls_public():
    assert _floor()[:2] == max(NEWEST_APIS.values())


def test_each_of_those_apis_is_one_graphrt_calls_and_this_torch_has():
    for api in NEWEST_APIS:
        assert callable(operator.attrgetter(api)(torch))
        name = api.rsplit(".", 1)[-1]
        assert any(f".{name}(" in path.read_text() for path in (REPO / "graphrt").rglob("*.py")), api


# -- transformers, the `hf` extra --------------------------------------------------------------

def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extra(name: str) -> list[str]:
    import configparser

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    return [line for line in config["options.extras_require"][name].splitlines() if line and not line.startswith("#")]


def test_the_hf_extra_and_the_test_extra_hold_transformers_to_the_floor_graphrt_checks():
    from graphrt.model.hf_causal import EXTRA, FLOOR

    floor = f"transformers>={'.'.join(map(str, FLOOR))}"
    assert _extra("hf") == [floor] and floor in _extra("test")
    assert EXTRA == "pip install 'graphrt[hf]'"  # the extra the refusal names is the one setup.cfg has
    pinned = [line.split("==")[1] for line in (REPO / "constraints.txt").read_text().splitlines()
              if line.startswith("transformers==")]
    assert len(pinned) == 1 and pinned[0].startswith("5.")


def test_a_transformers_older_than_the_cache_keyword_api_is_below_the_floor():
    from graphrt.model.hf_causal import below_floor

    # 5.23 names the cache `past_key_values`: passed `cache=`, its StaticCache would go unused
    assert below_floor("5.23.0") and below_floor("4.57.1") and below_floor("5.17.0")
    assert not below_floor("5.24.0") and not below_floor("5.25.1") and not below_floor("6.0.0.dev0")


@pytest.mark.processes
def test_a_run_of_a_transformers_family_without_transformers_names_the_one_command_that_installs_it(tmp_path):
    # `make run` installs graphrt's core only: a checkpoint of another family must say what to install
    import os
    import subprocess
    import sys

    import pytest

    pytest.importorskip("transformers")  # to make the checkpoint; the run below has none
    checkpoint = _script("hf_checkpoint").make_checkpoint("mistral", tmp_path / "mistral")
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "transformers.py").write_text("raise ImportError('not installed')\n")
    done = subprocess.run([sys.executable, "-m", "graphrt", "run", "--model", str(checkpoint), "--steps", "2"],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(blocked), str(REPO)])})
    assert done.returncode == 1
    assert done.stderr.strip() == ("error: mistral: model_type 'mistral' runs on transformers' own forward, "
                                   "and transformers is not installed: pip install 'graphrt[hf]'")
    assert done.stdout == ""
