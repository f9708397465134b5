"""`preserved(model)`: run a step, then hand back the state it changed. What a check runs (a tape
capture, the lint's eager runs) must leave the user's KV cache, module attributes and random
streams exactly as they were, and must not undo what the step built for itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from custom_ops import ops
from torch import nn

from graphrt.graphs.restore import AttributeSnapshot, preserved
from graphrt.measure.opcount import storage_key


class Stateful(nn.Module):
    """A module with a buffer and plain attributes of every kind a step may edit in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.arange(6.0))
        self.seen = [1, 2]
        self.by_name = {"a": 1}
        self.tags = {"x"}
        self.count = 0


def test_in_place_writes_to_existing_tensors_are_undone():
    model = Stateful()
    outside = torch.ones(3)
    with preserved(model):
        model.cache[2:4] = -1.0  # a write through a view reaches the whole storage
        model.cache.mul_(10)
        outside.zero_()
    assert torch.equal(model.cache, torch.arange(6.0))
    assert torch.equal(outside, torch.ones(3))


def test_a_tensor_written_through_out_is_undone_and_the_op_gets_its_keyword_arguments():
    x, y, target = torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0]), torch.zeros(2)
    with preserved(None):
        scaled = torch.add(x, y, alpha=2)  # alpha is keyword-only: it reaches the mode in kwargs
        torch.add(x, y, out=target)
        written = target.clone()
        x.add_(y, alpha=3)
        x_after = x.clone()
    assert scaled.tolist() == [21.0, 42.0]
    assert written.tolist() == [11.0, 22.0]
    assert x_after.tolist() == [31.0, 62.0]
    assert target.tolist() == [0.0, 0.0] and x.tolist() == [1.0, 2.0]


def test_a_tensor_an_op_hands_back_through_a_keyword_argument_is_still_restored():
    # pick's result is its keyword argument `b`: a view of existing memory, not a tensor the
    # step made, so a later write to it is undone like any other
    a, b = torch.ones(2), torch.zeros(2)
    with preserved(None):
        ops.pick(a, b=b).add_(7)
    assert b.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("make", [lambda: torch.zeros(3), lambda: torch.ones(3) * 0],
                         ids=["allocated", "computed"])
def test_a_tensor_the_step_makes_keeps_what_the_step_wrote(make):
    with preserved(None) as backup:
        made = make()
        made.add_(5)
    assert made.tolist() == [5.0, 5.0, 5.0]
    assert backup.saved == {}, "nothing that existed before the step was written"


def test_only_the_storages_written_are_copied_once_each():
    model = Stateful()
    untouched = torch.ones(4)
    with preserved(model) as backup:
        model.cache.add_(1)
        model.cache.add_(1)
        keys = set(backup.saved)
    assert keys == {storage_key(model.cache)}
    assert untouched.tolist() == [1.0] * 4


def test_a_skipped_storage_keeps_what_the_step_wrote():
    kept, restored = torch.zeros(2), torch.zeros(2)
    with preserved(None, skip={storage_key(kept)}):
        kept.fill_(7)
        restored.fill_(7)
    assert kept.tolist() == [7.0, 7.0] and restored.tolist() == [0.0, 0.0]


def test_attributes_edited_in_place_get_their_items_back_in_the_same_objects():
    model = Stateful()
    seen, by_name, tags = model.seen, model.by_name, model.tags
    with preserved(model):
        model.seen.append(3)
        model.by_name["b"] = 2
        model.tags.add("y")
    assert model.seen is seen and seen == [1, 2]
    assert model.by_name is by_name and by_name == {"a": 1}
    assert model.tags is tags and tags == {"x"}


def test_rebound_and_added_attributes_are_put_back_and_dropped():
    model = Stateful()
    child = nn.Linear(2, 2)
    model.child = child
    with preserved(model):
        model.count += 1
        model.seen = ["replaced"]
        model.extra = "added"
        child.note = "added to a submodule"
    assert model.count == 0 and model.seen == [1, 2]
    assert not hasattr(model, "extra") and not hasattr(child, "note")
    assert model.child is child


def test_the_random_streams_continue_as_if_the_step_never_ran():
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    with preserved(None):
        torch.rand(100)
    assert torch.equal(torch.rand(4), expected)


def test_state_is_put_back_when_the_step_fails():
    model = Stateful()
    with pytest.raises(RuntimeError, match="step failed"):
        with preserved(model):
            model.cache.zero_()
            model.seen.clear()
            raise RuntimeError("step failed")
    assert torch.equal(model.cache, torch.arange(6.0)) and model.seen == [1, 2]


class Recomputes(nn.Module):
    """Rebinds its attributes on every call: to new objects, equal or not to the old ones."""

    def forward(self, x):
        rows = float(x.shape[0])  # a new float object each call
        self.sizes = [rows, ("rows", rows)]
        self.by_name = {"rows": [rows]}
        self.label = "".join(["r", str(int(rows))])
        self.scale = rows if x.dtype == torch.float32 else int(rows)
        self.last = x[:1] * 1  # a new one-element tensor each call, equal to the last
        self.window = np.full(2, rows)  # its == gives an array, with no truth value
        return x


def test_an_attribute_rebound_to_an_equal_value_is_unchanged_but_a_new_tensor_or_type_is_a_change():
    # Containers are compared item by item, other values by ==, tensors by identity: a graph
    # keeps reading the tensor it captured, so a new one is a change even with equal values. A
    # value whose == cannot say counts as changed.
    model = Recomputes()
    model(torch.ones(2))
    before = AttributeSnapshot(model)
    model(torch.ones(2))
    assert [name for name, *_ in before.changes(AttributeSnapshot(model))] == ["last", "window"]
    model(torch.ones(3))
    assert [name for name, *_ in before.changes(AttributeSnapshot(model))] == [
        "sizes", "by_name", "label", "scale", "last", "window"]
    model(torch.ones(2, dtype=torch.float64))  # 2 where it was 2.0: equal, but an int
    assert [name for name, *_ in before.changes(AttributeSnapshot(model))] == ["scale", "last", "window"]
