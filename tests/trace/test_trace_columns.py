"""A trace's items held as columns: rows read back as they were given, sorting keeps ties in
order, and a kernel links to the latest call of its key that began by its start."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from graphrt.trace.read.columns import ABSENT
from graphrt.trace.read.events import Kernel, Kernels, link_launches


def test_rows_read_back_as_given_none_included():
    rows = [Kernel("b", 5, 9, 0, None, 3), Kernel("a", 1, 2, 1, 7, 4, launch=0, graph_id=2, graph_node_id=9)]
    assert list(Kernels.of(rows)) == rows
    assert Kernels.of(rows) != rows[::-1] and Kernels.of(rows) != rows[:1]


def test_a_column_set_from_an_array_of_any_integer_type_reads_back_its_values():
    table = Kernels.of([Kernel("k", n, n + 1, 0, None, 0) for n in range(3)])
    table.set_ints("launch", np.array([5, 0, 7], dtype=np.int32))
    assert [k.launch for k in table] == [5, 0, 7]


def test_sorting_by_start_keeps_rows_that_start_together_in_their_order():
    table = Kernels.of([Kernel(name, start, start + 1, 0, None, 0) for name, start in
                        [("late", 9), ("tie1", 4), ("early", 1), ("tie2", 4)]])
    order = table.sorted_by_start()
    assert [k.name for k in table] == ["early", "tie1", "tie2", "late"] and order.tolist() == [2, 1, 3, 0]


def test_sorting_keeps_ties_in_order_in_a_table_of_many_rows():
    # numpy's default sort is stable only for short arrays: 1000 rows on three starts are not
    rows = [Kernel(f"k{n}", n % 3, n % 3 + 1, 0, None, 0) for n in range(1000)]
    table = Kernels.of(rows)
    table.sorted_by_start()
    assert list(table) == sorted(rows, key=lambda k: k.start_ns)


def _link(call_keys, call_starts, kernel_keys, kernel_starts) -> list:
    found = link_launches(np.array(call_keys).reshape(-1, 1), np.array(call_starts),
                          np.array(kernel_keys).reshape(-1, 1), np.array(kernel_starts))
    return [None if i == ABSENT else i for i in found.tolist()]


def test_a_kernel_links_to_a_call_that_began_at_its_start_but_not_after():
    # calls: key 7 at t=10 and t=20, key 8 at t=15
    calls = ([7, 8, 7], [10, 15, 20])
    assert _link(*calls, [7, 7, 7, 8, 8, 9], [20, 19, 9, 15, 14, 30]) == [2, 0, None, 1, None, None]


ITEMS = st.tuples(st.integers(0, 1), st.integers(0, 5), st.integers(0, 20))  # (pid, correlation, start)


@settings(max_examples=300, deadline=None)
@given(st.lists(ITEMS, max_size=40), st.lists(ITEMS, max_size=20), st.booleans())
def test_each_kernel_links_to_the_last_call_of_its_key_that_began_by_its_start(calls, kernels, with_pid):
    """Against the rule as it reads, call by call; a key of one part (correlation) or of two
    (pid, correlation)."""
    calls.sort(key=lambda c: c[2])  # calls come in start order

    def key(item: tuple) -> tuple:
        return item[:2] if with_pid else item[1:2]

    def launched_by(kernel: tuple) -> int | None:
        began = [i for i, call in enumerate(calls) if key(call) == key(kernel) and call[2] <= kernel[2]]
        return began[-1] if began else None

    def keys(items: list) -> np.ndarray:
        return np.array([key(i) for i in items], dtype=np.int64).reshape(len(items), 2 if with_pid else 1)

    found = link_launches(keys(calls), np.array([c[2] for c in calls], dtype=np.int64),
                          keys(kernels), np.array([k[2] for k in kernels], dtype=np.int64))
    assert [None if i == ABSENT else i for i in found.tolist()] == [launched_by(k) for k in kernels]


def test_iterating_a_table_gives_the_rows_indexing_gives_however_many():
    rows = [Kernel(f"k{n % 3}", n, n + 1, 0, None if n % 2 else n, n, launch=None if n % 5 else n)
            for n in range(10_000)]  # more rows than are made at once
    table = Kernels.of(rows)
    assert list(table) == [table[i] for i in range(len(table))] == rows
    assert table[9_990:] == rows[9_990:] and table[:3] == rows[:3] and table[5:1:-2] == rows[5:1:-2]


def test_a_key_of_several_parts_links_only_where_every_part_matches():
    # (pid, correlation): pid 1's call 7 and pid 2's call 7 are different calls
    found = link_launches(np.array([[1, 7], [2, 7]]), np.array([10, 20]), np.array([[2, 7], [1, 7], [3, 7]]),
                          np.array([30, 30, 30]))
    assert [None if i == ABSENT else i for i in found.tolist()] == [1, 0, None]
