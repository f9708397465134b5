"""Items of one kind held as columns: a trace of millions of events holds no Python object per
event, and neither does a step's timeline of hundreds of thousands of kernels."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields, is_dataclass
from itertools import starmap
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")

ABSENT = -(1 << 63)  # an optional integer (Kernel.stream, .launch, ...) that is None
_ROWS_AT_ONCE = 4096  # rows made together while a table is iterated


def _field_names(row: type) -> tuple[str, ...]:
    """The fields of a dataclass or a NamedTuple, in order."""
    return tuple(f.name for f in fields(row)) if is_dataclass(row) else row._fields  # type: ignore[attr-defined]


class Table(Sequence[T]):
    """Items of one kind as columns: one `array('q')` per integer field, one list per other field
    (text, each distinct name held once; or any object): 8 bytes a row a field. A row read by
    index or iteration is made then (the dataclass or NamedTuple `row`), so code written against
    lists of items reads a table unchanged; hot loops read the columns (`ints`, `strings`).

    A reader fills a table by `append`ing one row's fields at a time, or `extend`ing it by
    columns, then sorts it by start (`sorted_by_start`)."""

    row: type[T]
    int_fields: tuple[str, ...]
    str_fields: tuple[str, ...]
    optional: frozenset[str] = frozenset()  # int fields that may be None (stored as ABSENT)

    def __init__(self) -> None:
        self._ints = {f: array("q") for f in self.int_fields}
        self._strs: dict[str, list[Any]] = {f: [] for f in self.str_fields}
        names = _field_names(self.row)
        self._order = [self._ints[f] if f in self._ints else self._strs[f] for f in names]
        self._absent = [f in self.optional for f in names]

    @classmethod
    def of(cls, rows: Iterable[T]) -> "Table[T]":
        table = cls()
        names = _field_names(cls.row)
        for row in rows:
            table.append(*(getattr(row, name) for name in names))
        return table

    def append(self, *values: Any) -> None:
        """One row, its fields in the row type's order."""
        for column, value, optional in zip(self._order, values, self._absent):
            column.append(ABSENT if optional and value is None else value)

    def extend(self, **columns: Sequence[Any] | np.ndarray) -> None:
        """Many rows at once: every field's values, one sequence (or integer array) a field."""
        assert columns.keys() == set(self.int_fields) | set(self.str_fields), columns.keys()
        for name, values in columns.items():
            if name in self._strs:
                self._strs[name].extend(values)  # type: ignore[arg-type]
            elif isinstance(values, np.ndarray):
                self._ints[name].frombytes(values.astype(np.int64).tobytes())
            else:
                self._ints[name].extend(ABSENT if v is None else v for v in values)

    def ints(self, name: str) -> np.ndarray:
        """An integer column as int64, sharing the column's memory (read it, do not keep it
        across an `append`)."""
        return np.frombuffer(self._ints[name], dtype=np.int64)

    def set_ints(self, name: str, values: np.ndarray) -> None:
        """Fill an integer column, one value a row (ABSENT for None)."""
        column = self._ints[name]
        del column[:]
        column.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())

    def strings(self, name: str) -> list[Any]:
        return self._strs[name]

    def __len__(self) -> int:
        return len(self._order[0])

    def __getitem__(self, i):  # type: ignore[override]: an int gives a row; a slice, rows
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.row(*(None if optional and column[i] == ABSENT else column[i]
                          for column, optional in zip(self._order, self._absent)))

    def __iter__(self) -> Iterator[T]:
        """The rows, made a few thousand at a time from the columns."""
        for start in range(0, len(self), _ROWS_AT_ONCE):
            stop = min(start + _ROWS_AT_ONCE, len(self))
            values = []
            for column, optional in zip(self._order, self._absent):
                part = column[start:stop].tolist() if isinstance(column, array) else column[start:stop]
                values.append([None if v == ABSENT else v for v in part] if optional else part)
            yield from starmap(self.row, zip(*values))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def sorted_by_start(self) -> np.ndarray:
        """Order the rows by start, rows that start together in the order they were added (as a
        stable sort of the rows would); returns the order (new row i was row order[i])."""
        order = np.argsort(self.ints("start_ns"), kind="stable")
        if np.all(order[1:] > order[:-1]):
            return order
        # in place, a column at a time, so a table of millions of rows is never held twice; the
        # text columns' order is read a few thousand rows at a time, not as a Python int per row
        for name in self._ints:
            column = self.ints(name)
            column[:] = column[order]
        for column in self._strs.values():
            column[:] = [column[i] for start in range(0, len(order), _ROWS_AT_ONCE)
                         for i in order[start:start + _ROWS_AT_ONCE].tolist()]
        return order
