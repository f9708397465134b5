"""Every text table `graphrt analyze` prints, with long names cut; `--json` keeps them whole.

A trace's names are whatever its program chose: a kernel or range name of megabytes would
otherwise be printed whole, in every row and in the rule under the header.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tabulate import tabulate

from graphrt.errors import cut

__all__ = ["cut", "table"]


def table(rows: Iterable[Sequence[object]], headers: Sequence[str] = ()) -> str:
    """`tabulate` of `rows` under `headers` (figures as they are formatted), every text cut."""
    return tabulate([[cut(c) if isinstance(c, str) else c for c in row] for row in rows],
                    headers=[cut(h) for h in headers], disable_numparse=True)
