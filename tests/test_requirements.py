"""The requirements setup.cfg states are true of the code: the torch floor is the oldest release
with every torch API graphrt calls."""

import importlib.util
import operator
from pathlib import Path

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
