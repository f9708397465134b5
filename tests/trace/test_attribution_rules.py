"""The rules of carrying module stacks over to a replay, each on sequences small enough to check
by hand: which of the longest alignments is taken, when a match is trusted, and when an
unmatched kernel takes a module from its neighbours."""

from itertools import combinations

import pytest

from graphrt.trace.analysis.attribution import (BETWEEN, MATCHED, UNATTRIBUTED, align, align_earliest,
                                                carry_over)


def _longest_alignments(reference: str, target: str) -> list[tuple[int, ...]]:
    """Every longest common subsequence of the two, as the reference indices it uses in order:
    brute force over all index choices."""
    for k in range(min(len(reference), len(target)), -1, -1):
        found = [ref for ref in combinations(range(len(reference)), k)
                 for tgt in combinations(range(len(target)), k)
                 if all(reference[i] == target[j] for i, j in zip(ref, tgt))]
        if found:
            return found
    return [()]


@pytest.mark.parametrize("reference, target", [
    ("ab", "ba"), ("aab", "ba"), ("aba", "bab"), ("abcab", "bacba"), ("abcabc", "cba"), ("aaa", "a"),
    ("abacbcab", "cabbac"), ("", "ab"), ("abc", ""),
])
def test_align_takes_the_latest_partners_and_align_earliest_the_earliest(reference, target):
    """Of all longest alignments, `align` matches the k-th matched item to a reference item at least
    as late as any of them does, `align_earliest` at least as early."""
    latest = [i for i in align(reference, target) if i is not None]
    earliest = [i for i in align_earliest(reference, target) if i is not None]
    alignments = _longest_alignments(reference, target)
    assert tuple(latest) in alignments and tuple(earliest) in alignments
    for other in alignments:
        assert all(late >= i for late, i in zip(latest, other))
        assert all(early <= i for early, i in zip(earliest, other))


def test_a_swapped_pair_keeps_its_later_item_latest_and_its_earlier_item_earliest():
    # eager ran gemm then softmax, the replay softmax then gemm: only one of them can match
    assert align(["gemm", "softmax"], ["softmax", "gemm"]) == [1, None]
    assert align_earliest(["gemm", "softmax"], ["softmax", "gemm"]) == [None, 0]


LAYERS = [("layers.0",), ("layers.1",)]


def test_a_kernel_two_module_calls_could_claim_is_left_unattributed():
    """A replay of one `mm` against an eager step that ran `mm` in layer 0 and again in layer 1:
    the latest alignment says layer 1, the earliest layer 0. They disagree, so no module is
    claimed; where both copies lie in one call, the match stands."""
    ambiguous = carry_over(["mm", "mm"], LAYERS, [0, 1], ["mm"])
    assert (ambiguous.stacks, ambiguous.how) == ([None], [UNATTRIBUTED])
    one_call = carry_over(["mm", "mm"], [("layers.0",), ("layers.0",)], [0, 0], ["mm"])
    assert (one_call.stacks, one_call.how) == ([("layers.0",)], [MATCHED])


MLP = ("mlp",)


@pytest.mark.parametrize("target, how", [
    # a copy between two matched kernels of one call takes that call's module
    (["gate", "copy", "up"], [MATCHED, BETWEEN, MATCHED]),
    # ... before the first match or after the last one there is no second side: none
    (["copy", "gate", "copy", "up"], [UNATTRIBUTED, MATCHED, BETWEEN, MATCHED]),
    (["gate", "copy", "up", "copy"], [MATCHED, BETWEEN, MATCHED, UNATTRIBUTED]),
    (["copy", "copy"], [UNATTRIBUTED, UNATTRIBUTED]),
], ids=["between", "leading", "trailing", "no-match"])
def test_an_unmatched_kernel_takes_a_module_only_between_matches_in_one_call(target, how):
    attribution = carry_over(["gate", "up"], [MLP, MLP], [7, 7], target)
    assert attribution.how == how
    assert attribution.stacks == [None if h == UNATTRIBUTED else MLP for h in how]


def test_a_copy_between_two_module_calls_or_outside_every_range_takes_none():
    # gate in one call, up in the next: the copy between them was issued in neither for sure
    apart = carry_over(["gate", "up"], [("layers.0",), ("layers.1",)], [0, 1], ["gate", "copy", "up"])
    assert apart.how == [MATCHED, UNATTRIBUTED, MATCHED]
    # both neighbours issued outside every range (call None): nothing to carry
    outside = carry_over(["gate", "up"], [(), ()], [None, None], ["gate", "copy", "up"])
    assert outside.how == [MATCHED, UNATTRIBUTED, MATCHED] and outside.stacks[1] is None
