"""Where the serving engines' own traces are found (tests/data/engines/README.md): in
tests/data/engines, or in the shared fixtures beside the repository (fixtures/engines), under
the same names. Tests that read them skip, naming the file, where neither holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).parent
PLACES = (TESTS / "data" / "engines", TESTS.parent.parent / "shared" / "fixtures" / "engines")


def engine_trace(relative: str) -> Path:
    """The trace at `relative` (e.g. "sglang_decode/sglang_Qwen3-8B_decode.json.gz") where one
    of PLACES holds it; else the test skips."""
    for place in PLACES:
        if (place / relative).is_file():
            return place / relative
    pytest.skip(f"tests/data/engines/{relative} is not here, nor in the shared fixtures "
                "(tests/data/engines/README.md says where it comes from)")
