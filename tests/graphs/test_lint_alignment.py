"""How the lint lines up the ops of two captures before comparing them (findings._alignment).

Ops pair up by name, in order; what does not pair is a block of control flow. The common head
and tail are paired directly and only the middle goes to difflib.
"""

from __future__ import annotations

from hypothesis import given, strategies as st

from graphrt.graphs.capture_record import RecordedOp
from graphrt.graphs.findings import _alignment


def ops(names: str | list[str]) -> list[RecordedOp]:
    return [RecordedOp(name, (), (), (), None) for name in names]


def align(a, b):
    return _alignment(ops(a), ops(b))


def test_identical_captures_pair_every_op_and_have_no_blocks():
    assert align("abc", "abc") == ([(0, 0), (1, 1), (2, 2)], [])


def test_a_branch_in_the_middle_is_one_block_between_the_paired_head_and_tail():
    # capture 1 runs A B where capture 2 runs C
    assert align("xyABzw", "xyCzw") == ([(0, 0), (1, 1), (4, 3), (5, 4)], [(2, 4, 2, 3)])


def test_ops_that_match_between_two_branches_pair_up():
    # the head (p) and tail (s) aside, difflib pairs q r inside the middle
    assert align("pAqrBs", "pCqrDs") == ([(0, 0), (2, 2), (3, 3), (5, 5)], [(1, 2, 1, 2), (4, 5, 4, 5)])


def test_a_capture_that_is_the_others_head_leaves_the_rest_as_one_block():
    assert align("abcd", "ab") == ([(0, 0), (1, 1)], [(2, 4, 2, 2)])
    assert align("ab", "xab") == ([(0, 1), (1, 2)], [(0, 0, 0, 1)])


def test_the_common_tail_pairs_end_to_end_before_difflib_sees_the_middle():
    # difflib alone would pair "a" with the first "a" of "baa"; the ends of two captures of one
    # step are the same ops, so the last pairs with the last
    assert align("a", "baa") == ([(0, 2)], [(0, 0, 0, 2)])
    assert align("aa", "baaa") == ([(0, 2), (1, 3)], [(0, 0, 0, 2)])
    # the tail is walked from both ends at once, and stops at the first op that differs
    assert align("aba", "aaa") == ([(0, 0), (2, 2)], [(1, 2, 1, 2)])
    # a tail as long as the rest after the head: it stops where the head ends
    assert align("ab", "aab") == ([(0, 0), (1, 2)], [(1, 1, 1, 2)])


def test_long_captures_of_few_kinds_of_op_still_pair_op_by_op():
    # A decode step is hundreds of ops of a few names. difflib's "autojunk" would treat names
    # that frequent as junk and pair none of them.
    middle = ["mm", "add"] * 150
    pairs, blocks = align(["A", *middle, "B"], ["C", *middle, "D"])
    assert pairs == [(i, i) for i in range(1, 301)]
    assert blocks == [(0, 1, 0, 1), (301, 302, 301, 302)]


@given(st.text("abc", max_size=12), st.text("abc", max_size=12))
def test_every_op_is_paired_once_with_an_op_of_its_name_or_lies_in_one_block(a, b):
    pairs, blocks = align(a, b)
    assert all(a[i] == b[j] for i, j in pairs)
    assert pairs == sorted(pairs) and len({j for _, j in pairs}) == len(pairs)
    assert [j for _, j in pairs] == sorted(j for _, j in pairs)  # in order in both captures
    in_a = sorted([i for i, _ in pairs] + [i for i1, i2, _, _ in blocks for i in range(i1, i2)])
    in_b = sorted([j for _, j in pairs] + [j for _, _, j1, j2 in blocks for j in range(j1, j2)])
    assert in_a == list(range(len(a))) and in_b == list(range(len(b)))
    # the common head and tail are always paired
    head = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert pairs[:head] == [(k, k) for k in range(head)]
