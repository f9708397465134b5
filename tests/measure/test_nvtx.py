"""NVTX ranges: one per module call, nested like the calls, named and coloured by kind; detaching
leaves the model as it was (and hooks are never used); the switch; compile-safety; telling when a
profiler records nothing."""

from __future__ import annotations

import inspect
import os
import shutil
import sqlite3
import textwrap
from pathlib import Path

import nsys_runs
import nvtx
import pytest
import torch
from nvtx._lib import lib as nvtx_lib
from torch import nn

from graphrt.graphs import capture
from graphrt.measure import nvtx as gn, range_names
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def ranges_on():
    """Every test starts with ranges switched on and leaves them so."""
    previous = gn.set_enabled(True)
    yield
    gn.set_enabled(previous)


@pytest.fixture(scope="module")
def tiny():
    """The real model (`tiny` preset) with its cache and rotary table set up."""
    model = build_model(PRESETS["tiny"], torch.device("cpu"), torch.float32)
    model.setup_cache(max_batch=2, max_seq_len=16)
    return model


def decode_inputs(batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(batch, 1, dtype=torch.long), torch.full((batch,), 3, dtype=torch.long)


def pushes(events: list[tuple[str, str]]) -> list[str]:
    return [name for kind, name in events if kind == "push"]


# A local tree whose call order is known exactly: `mix` is called twice, `unused` never.
class Leaf(nn.Module):
    def forward(self, x):
        return x + 1


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = Leaf(), Leaf()

    def forward(self, x):
        return self.second(self.first(x))


class Tree(nn.Module):
    def __init__(self):
        super().__init__()
        self.pair = Pair()
        self.mix = nn.Linear(4, 4)
        self.unused = Leaf()

    def forward(self, x):
        return self.mix(self.mix(self.pair(x)))


class Failing(nn.Module):
    def __init__(self):
        super().__init__()
        self.ok, self.bad = Leaf(), nn.Linear(3, 3)

    def forward(self, x):
        return self.bad(self.ok(x))  # x has 4 features: bad raises


# ---------------------------------------------------------------------------------------------
# One range per module call, nested like the calls


def test_each_call_opens_one_range_nested_in_its_caller():
    model = Tree()
    with gn.attach(model), gn.record_to([]) as events:
        model(torch.ones(2, 4))
    assert events == [
        ("push", "(Tree)"),
        ("push", "pair (Pair)"),
        ("push", "pair.first (Leaf)"), ("pop", "pair.first (Leaf)"),
        ("push", "pair.second (Leaf)"), ("pop", "pair.second (Leaf)"),
        ("pop", "pair (Pair)"),
        ("push", "mix (Linear)"), ("pop", "mix (Linear)"),
        ("push", "mix (Linear)"), ("pop", "mix (Linear)"),
        ("pop", "(Tree)"),
    ]


def test_real_model_every_called_module_has_one_range_inside_its_callers(tiny):
    calls: dict[str, int] = {}  # counted by plain torch hooks, independently of graphrt's

    def count(name):
        return lambda module, args, output: calls.__setitem__(name, calls.get(name, 0) + 1)

    counters = [m.register_forward_hook(count(range_names.module_range_name(q, m)))
                for q, m in tiny.named_modules()]
    try:
        with gn.attach(tiny) as ranges, gn.record_to([]) as events, torch.no_grad():
            tiny.decode_step(*decode_inputs())
    finally:
        for c in counters:
            c.remove()

    opened = pushes(events)
    assert {name: opened.count(name) for name in opened} == calls
    # Qwen2Model and the ModuleList are containers the forward walks without calling, and the
    # KV cache is used through .update(): every other module runs once per step.
    never_called = {"model (Qwen2Model)", "model.layers (ModuleList)",
                    "model.layers.0.self_attn.cache (KVCache)",
                    "model.layers.1.self_attn.cache (KVCache)"}
    assert sorted(opened) == sorted(set(ranges.range_names) - never_called)
    # each range opens inside the range of a module that contains it
    stack: list[str] = []
    for kind, name in events:
        if kind == "push":
            qualname = range_names.parse_range_name(name)[0]
            if stack:
                parent = range_names.parse_range_name(stack[-1])[0]
                assert parent == "" or qualname.startswith(parent + "."), (parent, qualname)
            stack.append(name)
        else:
            assert stack.pop() == name
    assert stack == []


def test_a_module_that_raises_still_closes_its_range_and_its_callers():
    model = Failing()
    with gn.attach(model), gn.record_to([]) as events:
        with pytest.raises(RuntimeError):
            model(torch.ones(2, 4))
    assert events == [
        ("push", "(Failing)"),
        ("push", "ok (Leaf)"), ("pop", "ok (Leaf)"),
        ("push", "bad (Linear)"), ("pop", "bad (Linear)"),
        ("pop", "(Failing)"),
    ]


def test_the_range_covers_forward_and_the_modules_own_hooks_run_outside_it():
    model = Leaf()
    seen: list[tuple[str, int]] = []  # (hook, events recorded when it ran)

    def note(hook):
        return lambda *args: seen.append((hook, len(events)))

    model.register_forward_pre_hook(note("pre, before attach"))
    model.register_forward_hook(note("post, before attach"))
    with gn.attach(model), gn.record_to([]) as events:
        model.register_forward_pre_hook(note("pre, after attach"))
        model.register_forward_hook(note("post, after attach"))
        model(torch.ones(1))
    # the range wraps forward, which torch calls after every pre-hook and before every hook
    assert seen == [("pre, before attach", 0), ("pre, after attach", 0),
                    ("post, before attach", 2), ("post, after attach", 2)]
    assert events == [("push", "(Leaf)"), ("pop", "(Leaf)")]


def test_a_wrapped_forward_keeps_the_name_and_signature_of_the_method():
    model = nn.Linear(4, 4)
    with gn.attach(model):
        assert model.forward.__name__ == "forward"
        assert inspect.signature(model.forward) == inspect.signature(nn.Linear(1, 1).forward)


# ---------------------------------------------------------------------------------------------
# Detaching leaves the model unchanged


HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
              "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def hook_state(model: nn.Module) -> dict[str, list]:
    return {f"{q}.{d}": list(getattr(m, d).items())
            for q, m in model.named_modules() for d in HOOK_DICTS}


def instance_forwards(model: nn.Module) -> dict[str, object]:
    """Each module's instance-level `forward` (None where calls reach the class's method)."""
    return {q: vars(m).get("forward") for q, m in model.named_modules()}


def test_remove_leaves_no_instance_forward_and_hooks_are_never_touched(tiny):
    user_hook = tiny.model.norm.register_forward_hook(lambda m, a, o: None)
    try:
        hooks = hook_state(tiny)
        assert set(instance_forwards(tiny).values()) == {None}
        with torch.no_grad():
            expected = tiny.decode_step(*decode_inputs())
            handle = gn.attach(tiny)
            assert None not in instance_forwards(tiny).values()  # every module wrapped
            assert hook_state(tiny) == hooks
            wrapped = tiny.decode_step(*decode_inputs())
            handle.remove()
            after = tiny.decode_step(*decode_inputs())
        assert set(instance_forwards(tiny).values()) == {None}
        assert hook_state(tiny) == hooks
        assert torch.equal(wrapped, expected) and torch.equal(after, expected)
        handle.remove()  # a second remove is harmless
        assert set(instance_forwards(tiny).values()) == {None}
    finally:
        user_hook.remove()


def test_leaving_the_with_block_detaches():
    model = Tree()
    with gn.attach(model) as ranges:
        assert len(ranges.range_names) == len(list(model.modules()))
    assert set(instance_forwards(model).values()) == {None}
    with gn.record_to([]) as events:
        model(torch.ones(2, 4))
    assert events == []


def test_an_instance_forward_set_before_attach_runs_inside_the_range_and_comes_back():
    model = Pair()
    calls: list[int] = []  # events recorded when someone else's wrapper ran

    def theirs(x):
        calls.append(len(events))
        return type(model).forward(model, x) * 10

    model.forward = theirs
    with gn.attach(model), gn.record_to([]) as events:
        assert torch.equal(model(torch.zeros(1)), torch.full((1,), 20.0))
    assert calls == [1]
    assert pushes(events) == ["(Pair)", "first (Leaf)", "second (Leaf)"]
    assert vars(model)["forward"] is theirs
    assert instance_forwards(model) == {"": theirs, "first": None, "second": None}


def test_an_instance_forward_set_after_attach_stays_on_remove():
    model = Leaf()
    with gn.attach(model):
        ranged = model.forward
        model.forward = lambda x: ranged(x) * 10  # theirs calls graphrt's wrapper
    assert vars(model)["forward"] is not ranged
    with gn.record_to([]) as events:
        assert torch.equal(model(torch.zeros(1)), torch.full((1,), 10.0))
    assert events == [("push", "(Leaf)"), ("pop", "(Leaf)")]


def test_attaching_twice_is_refused_and_keeps_the_first_attachment():
    model = Tree()
    with gn.attach(model):
        state = instance_forwards(model)
        with pytest.raises(ValueError, match="already attached to the model"):
            gn.attach(model)
        assert instance_forwards(model) == state
        with gn.record_to([]) as events:
            model(torch.ones(2, 4))
        assert len(events) == 12  # still one range per call
    assert set(instance_forwards(model).values()) == {None}


def test_a_refused_attach_undoes_the_modules_it_had_wrapped():
    model = Tree()
    with gn.attach(model.pair):
        state = instance_forwards(model)  # pair and its leaves wrapped, the root not
        # the root comes first in named_modules(): it is wrapped, then unwrapped at `pair`
        with pytest.raises(ValueError, match="already attached to pair"):
            gn.attach(model)
        assert instance_forwards(model) == state
    assert set(instance_forwards(model).values()) == {None}


# ---------------------------------------------------------------------------------------------
# Names and kinds


EXPECTED_KINDS = {
    "": "other",
    "model": "other",
    "model.embed_tokens": "embedding",
    "model.layers": "other",
    "model.layers.0": "other",
    "model.layers.0.self_attn": "attention",
    "model.layers.0.self_attn.qkv_proj": "attention",
    "model.layers.0.self_attn.o_proj": "attention",
    "model.layers.0.self_attn.cache": "attention",
    "model.layers.0.mlp": "mlp",
    "model.layers.0.mlp.gate_up_proj": "mlp",
    "model.layers.0.mlp.down_proj": "mlp",
    "model.layers.0.input_layernorm": "norm",
    "model.layers.0.post_attention_layernorm": "norm",
    "model.norm": "norm",
    "lm_head": "lm_head",
    "rotary": "attention",
}


def test_every_qwen2_module_has_its_kind(tiny):
    kinds = {q: range_names.kind_of(q, m) for q, m in tiny.named_modules()
             if not q.startswith("model.layers.1")}
    assert kinds == EXPECTED_KINDS


def test_kind_from_a_trace_name_matches_kind_from_the_module(tiny):
    # the analyzer only has range names: parsing one gives the same kind as the module did
    for qualname, module in tiny.named_modules():
        name = range_names.module_range_name(qualname, module)
        assert range_names.parse_range_name(name) == (qualname, type(module).__name__)
        assert range_names.kind_of(*range_names.parse_range_name(name)) == range_names.kind_of(qualname, module)


@pytest.mark.parametrize("qualname, cls, kind", [
    ("model.rotary_emb", "Qwen2RotaryEmbedding", "attention"),  # HF's rotary, not an embedding
    ("model.layers.5.self_attn.q_norm", "Qwen3RMSNorm", "norm"),
    ("q_proj", "Linear", "attention"),  # HF's unpacked projections, in a peer's trace
    ("up_proj", "Linear", "mlp"),
    ("transformer.h.0.attn", "GPT2Attention", "attention"),
    ("decoder.ffn", "FeedForwardMLP", "mlp"),
    ("encoder.conv", "Conv1d", "other"),
])
def test_kind_rules_cover_names_beyond_qwen2(qualname, cls, kind):
    assert range_names.kind_of(qualname, cls) == kind


@pytest.mark.parametrize("name", ["prefill", "capture[bs=8]", "model.norm(Qwen2RMSNorm)", "(x"])
def test_parse_range_name_rejects_names_no_module_has(name):
    with pytest.raises(ValueError, match="not a module range name"):
        range_names.parse_range_name(name)


def test_every_kind_has_a_colour_of_its_own():
    assert set(range_names.KIND_COLORS) == set(range_names.KINDS)
    assert len(set(range_names.KIND_COLORS.values())) == len(range_names.KINDS)


# ---------------------------------------------------------------------------------------------
# Named ranges, the switch, the recorder


def test_named_ranges_nest_and_are_built_once_per_name():
    assert gn.nvtx_range("replay[bs=8]") is gn.nvtx_range("replay[bs=8]")
    with gn.record_to([]) as events:
        with gn.nvtx_range("decode_step[eager]"):
            with gn.nvtx_range("copy_in"):
                pass
            with gn.nvtx_range("replay[bs=8]"), gn.nvtx_range("replay[bs=8]"):
                pass
    assert events == [
        ("push", "decode_step[eager]"),
        ("push", "copy_in"), ("pop", "copy_in"),
        ("push", "replay[bs=8]"), ("push", "replay[bs=8]"),
        ("pop", "replay[bs=8]"), ("pop", "replay[bs=8]"),
        ("pop", "decode_step[eager]"),
    ]


def test_a_named_range_closes_when_its_block_raises():
    with gn.record_to([]) as events:
        with pytest.raises(KeyError), gn.nvtx_range("prefill"):
            raise KeyError("x")
    assert events == [("push", "prefill"), ("pop", "prefill")]


def test_switched_off_nothing_is_attached_or_recorded():
    model = Tree()
    assert gn.set_enabled(False) is True
    assert gn.enabled() is False
    with gn.record_to([]) as events:
        with gn.attach(model) as ranges, gn.nvtx_range("prefill"):
            model(torch.ones(2, 4))
            assert set(instance_forwards(model).values()) == {None}
        assert ranges.range_names == []
    assert events == []
    assert gn.set_enabled(True) is False


def test_ranges_attached_before_switching_off_stay_until_removed():
    model = Leaf()
    with gn.attach(model):
        gn.set_enabled(False)
        with gn.record_to([]) as events:
            model(torch.ones(1))
    assert events == [("push", "(Leaf)"), ("pop", "(Leaf)")]


def test_recorders_nest_and_leave_the_library_calls_in_place():
    outer: list = []
    with gn.record_to(outer):
        with gn.record_to([]) as inner, gn.nvtx_range("copy_in"):
            pass
        with gn.nvtx_range("prefill"):
            pass
    assert inner == [("push", "copy_in"), ("pop", "copy_in")]
    assert pushes(outer) == ["copy_in", "prefill"]
    # Without a recorder, module wrappers and ranges call the NVTX library directly, or do-nothing
    # functions where nvtx handed graphrt a DummyDomain (nvtx >= 0.2.12 with no tool attached).
    # The pinned nvtx 0.2.11 always gives a real domain: CI and the device check see the first.
    if gn.domain_is_dummy():
        assert (gn._push, gn._pop) == (gn._noop_push, gn._noop_pop)
    else:
        assert (gn._push, gn._pop) == (nvtx_lib.push_range, nvtx_lib.pop_range)


# ---------------------------------------------------------------------------------------------
# torch.compile


def compile_stats() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"],
            "graph breaks": sum(counters["graph_break"].values())}


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters emptied before and after the test."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_ranges_trace_away_under_fullgraph_compile_without_recompiling(fresh_dynamo):
    model, x = Tree(), torch.ones(2, 4)
    expected = model(x)
    with gn.attach(model), gn.record_to([]) as events:
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        for _ in range(3):
            assert torch.equal(compiled(x), expected)
        assert events == []  # the compiled graph holds no ranges
        model(x)  # the eager model keeps its ranges
    assert compile_stats() == {"graphs": 1, "graph breaks": 0}
    assert pushes(events)[0] == "(Tree)" and len(events) == 12


@pytest.mark.compiles
def test_the_decode_step_compiles_to_one_graph_with_ranges_attached(tiny, fresh_dynamo):
    with torch.no_grad():
        expected = tiny.decode_step(*decode_inputs())
        with gn.attach(tiny), gn.record_to([]) as events:
            compiled = torch.compile(tiny.decode_step, fullgraph=True, backend="eager")
            for _ in range(3):
                assert torch.equal(compiled(*decode_inputs()), expected)
    assert events == []
    assert compile_stats() == {"graphs": 1, "graph breaks": 0}


# ---------------------------------------------------------------------------------------------
# Graph capture


def test_ranges_fire_at_capture_and_a_replay_runs_none(tiny):
    tokens, positions = decode_inputs()
    with torch.no_grad(), gn.attach(tiny):
        with gn.record_to([]) as eager:
            expected = tiny.decode_step(tokens, positions)
        with gn.record_to([]) as events:
            graph, out = capture(lambda: tiny.decode_step(tokens, positions), device="cpu",
                                 warmup=0)  # a TapeGraph here, a CUDA graph on a GPU
            at_capture = list(events)
            graph.replay()
    assert at_capture == eager  # capture ran the step's Python once: the same ranges
    assert events == at_capture  # the replay ran no Python, so no range
    assert torch.equal(out, expected)


# ---------------------------------------------------------------------------------------------
# Will a profiler record the ranges?


def test_profiler_attached_reads_the_variables_nsys_sets(monkeypatch):
    for var in gn.PROFILER_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    assert gn.profiler_attached() is False
    monkeypatch.setenv("NSYS_PROFILING_SESSION_ID", "4242")
    assert gn.profiler_attached() is True
    assert gn.profiler_attached({"NVTX_INJECTION64_PATH": "/x/libToolsInjection64.so"}) is True
    assert gn.profiler_attached({"NSYS_PROFILING_SESSION_ID": ""}) is False


def test_no_warning_without_a_profiler(monkeypatch):
    for var in gn.PROFILER_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    assert gn.check_recording() is None


def test_no_warning_when_the_domain_is_real(monkeypatch):
    monkeypatch.setenv("NSYS_PROFILING_SESSION_ID", "4242")
    domain = nvtx.get_domain(gn.DOMAIN_NAME)
    if gn.domain_is_dummy(domain):
        pytest.skip("this nvtx hands out a DummyDomain when no tool is attached")
    assert gn.check_recording(domain=domain) is None


def test_warning_when_a_profiler_gets_a_dummy_domain(monkeypatch):
    # nvtx >= 0.2.12 returns its DummyDomain whenever no tool reports the domain enabled: here
    # (no tool at all) and under Nsight Systems 2022.4. 0.2.11, the pinned release, has none.
    domain = nvtx.get_domain("graphrt-test-unprofiled")
    if not gn.domain_is_dummy(domain):
        pytest.skip(f"runs with nvtx >= 0.2.12, which has a DummyDomain; nvtx {nvtx_version()} "
                    "has none (test_the_warning_rule_on_a_dummy_domain checks the rule here)")
    monkeypatch.setenv("NSYS_PROFILING_SESSION_ID", "4242")
    warning = gn.check_recording(domain=domain)
    assert warning == (f"nvtx {nvtx_version()} hands this profiler a DummyDomain: no ranges will "
                       "be recorded; install nvtx==0.2.11")
    monkeypatch.delenv("NSYS_PROFILING_SESSION_ID")
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    assert gn.check_recording(domain=domain) is None


def test_the_warning_rule_on_a_dummy_domain(monkeypatch):
    # The rule of the test above, on any nvtx: warn only when a profiler is attached and the
    # domain is a DummyDomain. nvtx 0.2.11 has no such class, so one stands in for it here.
    class DummyDomain:
        pass

    monkeypatch.setattr(gn, "_DummyDomain", DummyDomain)
    real = nvtx.get_domain(gn.DOMAIN_NAME)
    profiled = {"NSYS_PROFILING_SESSION_ID": "4242"}
    assert gn.check_recording(profiled, domain=DummyDomain()) == (
        f"nvtx {nvtx_version()} hands this profiler a DummyDomain: no ranges will be recorded; "
        "install nvtx==0.2.11")
    assert gn.check_recording({}, domain=DummyDomain()) is None  # nothing would record anyway
    assert gn.check_recording(profiled, domain=real) is None


def nvtx_version() -> str:
    from importlib.metadata import version

    return version("nvtx")


# ---------------------------------------------------------------------------------------------
# Under Nsight Systems


NSYS_SCRIPT = textwrap.dedent("""
    import torch
    from torch import nn
    from graphrt.measure import nvtx as gn

    class Leaf(nn.Module):
        def forward(self, x):
            return x + 1

    class Tree(nn.Module):
        def __init__(self):
            super().__init__()
            self.leaf, self.mix = Leaf(), nn.Linear(4, 4)

        def forward(self, x):
            return self.mix(self.mix(self.leaf(x)))

    print("warning:", gn.check_recording(), "attached:", gn.profiler_attached())
    model = Tree()
    gn.attach(model)
    with gn.nvtx_range("decode_step[eager]"):
        model(torch.ones(2, 4))
""")


@pytest.mark.nsys
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nsys") is None, reason="needs the Nsight Systems CLI on PATH")
def test_nsys_records_every_range_nested_and_coloured(tmp_path):
    script = tmp_path / "ranges.py"
    script.write_text(NSYS_SCRIPT)
    run = nsys_runs.profile(script, tmp_path / "ranges", "-t", "nvtx", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "warning: None attached: True" in run.stdout, run.stdout + run.stderr
    export = nsys_runs.export(tmp_path / "ranges.nsys-rep", tmp_path / "ranges.sqlite")
    with sqlite3.connect(export) as db:
        domain_id = db.execute("SELECT domainId FROM NVTX_EVENTS WHERE eventType = 75 "
                               "AND text = ?", (gn.DOMAIN_NAME,)).fetchone()[0]
        rows = db.execute(
            "SELECT e.start, e.end, COALESCE(e.text, s.value), e.color FROM NVTX_EVENTS e "
            "LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE e.eventType = 59 AND e.domainId = ? ORDER BY e.start", (domain_id,)).fetchall()
    names = [name for _, _, name, _ in rows]
    assert names == ["decode_step[eager]", "(Tree)", "leaf (Leaf)", "mix (Linear)", "mix (Linear)"]
    spans = {name: (start, end) for start, end, name, _ in rows}
    for outer, inner in [("decode_step[eager]", "(Tree)"), ("(Tree)", "leaf (Leaf)"),
                         ("(Tree)", "mix (Linear)")]:
        assert spans[outer][0] <= spans[inner][0] <= spans[inner][1] <= spans[outer][1]
    colours = {name: colour & 0xFFFFFF for _, _, name, colour in rows}
    assert colours["(Tree)"] == range_names.KIND_COLORS["other"] & 0xFFFFFF
    assert colours["decode_step[eager]"] == range_names.STEP_COLORS["decode_step"] & 0xFFFFFF
