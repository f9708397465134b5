"""NVTX ranges on every nn.Module and around the steps graphrt runs, in one domain: `graphrt`.

    handle = attach(model)                 # one range per module call, until handle.remove()
    with nvtx_range("replay[bs=8]"):       # a named range: prefill, decode_step[eager], copy_in...
        ...
    set_enabled(False)                     # --no-nvtx: attach() and nvtx_range() hand out no-ops
    warning = check_recording()            # a profiler is attached but nothing will be recorded?

Module ranges are named `<qualified name> (<class>)`, e.g. `model.layers.3.self_attn
(Qwen2Attention)`; the root has an empty qualified name, so its range is `(Qwen2ForCausalLM)`.
`parse_range_name` reverses the naming and `kind_of` maps either form to one of `KINDS`, which
also picks the range's colour.

Costs: every range's event attributes (registered string and colour) are built once, when the
module is attached or the name is first used, so a push is one call into the NVTX library (about
100 ns per push/pop pair with no profiler attached). A module's range is a wrapper around its
`forward`, not a pair of forward hooks: registering any hook sends every call of that module down
torch's slower hooked path in `nn.Module._call_impl`. On a 2-core CPU shared with other jobs,
no profiler attached:

    python -m timeit -s "import torch; from graphrt.measure import nvtx" \\
        -s "m = torch.nn.Identity(); x = torch.ones(1); nvtx.attach(m)" "m(x)"

gives 1.9 µs per call, against 1.5 µs with nothing attached and 3.6 µs with one empty forward
pre-hook in place of `nvtx.attach(m)`. Timed in one process, in interleaved blocks (3 runs, each
the median of 4000 steps per variant for `tiny` and 200 for `qwen2-0.5b`; batch 1, fp32,
position 16, one torch thread), the wrapper adds 17-19 µs (+1.6-1.8%, 0.6 µs per module call) to the `tiny`
eager decode step of 1.06 ms where hooks added 179-186 µs (+17%, 6.3 µs per call); on
`qwen2-0.5b` (293 module calls, a 178 ms step) it adds 0.3-1.9 ms (+0.2-1.0%, inside the step's
run-to-run noise) where hooks added 3.8-5.4 ms (+2.2-3.0%). Still a tool overhead to measure and
report (docs/design.md, Invariants, 6), not to assume: `graphrt trace --overhead` measures it.

Where the ranges appear: the wrappers are Python, so they fire when Python runs the module.
Under CUDA graph capture they fire once, at capture; a replay runs no Python, so its kernels all
fall inside the range around `replay()`. Under `torch.compile` the range calls are traced away
(see `_ranged`), so a compiled model shows only the ranges around it.

Tests observe ranges without a profiler through `record_to(events)`, which swaps the functions
the wrappers call for recording ones while it is open, so the ordinary path pays nothing for it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import nvtx
import torch
from nvtx._lib import lib as _nvtx_lib
from torch import nn

from graphrt.measure.range_names import (DEFAULT_STEP_COLOR, KIND_COLORS, STEP_COLORS, kind_of,
                                         module_range_name)

DOMAIN_NAME = "graphrt"

# Set by Nsight Systems in the profiled process (both checked against nsys 2022.4); the second
# is the NVTX loader's own variable, so any NVTX tool that injects itself sets it.
PROFILER_ENV_VARS = ("NSYS_PROFILING_SESSION_ID", "NVTX_INJECTION64_PATH")

# nvtx >= 0.2.12 returns this class from get_domain() when no tool says the domain is enabled;
# 0.2.11 (the pinned release) has no such class and always returns a real Domain.
_DummyDomain: type | None = getattr(_nvtx_lib, "DummyDomain", None)


def _noop_push(attrs: Any, handle: Any) -> None:
    pass


def _noop_pop(handle: Any) -> None:
    pass


_DOMAIN = nvtx.get_domain(DOMAIN_NAME)
_IS_DUMMY = _DummyDomain is not None and isinstance(_DOMAIN, _DummyDomain)
_HANDLE = None if _IS_DUMMY else _DOMAIN.handle

# What module wrappers and named ranges call: `_push(token, _HANDLE)` and `_pop(_HANDLE)`. They
# are module globals, looked up at each call, so `record_to` can swap them; normally they are the
# NVTX library's own functions (no Python frame in between).
_push: Callable[[Any, Any], None] = _noop_push if _IS_DUMMY else _nvtx_lib.push_range
_pop: Callable[[Any], None] = _noop_pop if _IS_DUMMY else _nvtx_lib.pop_range

_names: dict[Any, str] = {}  # token -> range name, for record_to
_enabled = True

# Dynamo folds this function to True while it traces, which removes the range calls from a
# compiled graph without a guard or a graph break (see _ranged). Eagerly it is one frame
# that returns False, a quarter of the cost of torch.compiler.is_compiling().
_is_compiling = torch.compiler.is_dynamo_compiling


def _token(name: str, color: int) -> Any:
    """Register `name` once; return what `_push` takes for it.

    With a real domain that is the NVTX event attributes (registered string + colour), cached by
    the nvtx package per (name, colour). A dummy domain builds none, so the name stands in.
    """
    token = name if _IS_DUMMY else _DOMAIN.get_event_attributes(message=name, color=color)
    _names[token] = name
    return token


# ---------------------------------------------------------------------------------------------
# The on/off switch


def set_enabled(on: bool) -> bool:
    """Turn graphrt's NVTX ranges on or off; returns the previous setting.

    Decides what `attach` and `nvtx_range` hand out from now on. Ranges already attached stay until
    their handle is removed, so flip the switch before attaching, not in the middle of a step.
    """
    global _enabled
    previous, _enabled = _enabled, bool(on)
    return previous


def enabled() -> bool:
    return _enabled


# ---------------------------------------------------------------------------------------------
# Module ranges


# (module, graphrt's wrapper, the instance-level forward it replaced or None)
_Wrapped = tuple[nn.Module, Callable[..., Any], Callable[..., Any] | None]


class ModuleRanges:
    """The ranges `attach` put on a model. `remove()` (or leaving a `with` block) takes every one
    off again: each module's instance-level `forward` is back to what it was (none, for a plain
    module), and its hook dictionaries were never touched."""

    def __init__(self, wrapped: list[_Wrapped], range_names: list[str]):
        self._wrapped = wrapped
        self.range_names = range_names  # one per module wrapped, in named_modules() order

    def remove(self) -> None:
        for module, wrapper, previous in self._wrapped:
            _unwrap(module, wrapper, previous)
        self._wrapped = []

    def __enter__(self) -> ModuleRanges:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _ranged(forward: Callable[..., Any], token: Any) -> Callable[..., Any]:
    """`forward` inside one NVTX range, closed in a `finally` so a module that raises closes it.

    `torch.compile(fullgraph=True)` inlines this like any other Python: a call into the NVTX
    library would be an unsupported call, and `torch.compiler.disable` on the wrapper is refused
    too under fullgraph ("Skip calling torch.compiler.disable()d function", torch 2.13). So it
    first asks `_is_compiling()`: dynamo folds that to True, the range calls vanish from the
    graph, and no guard is added (compiled code does not recompile). Reading a flag instead
    would not do: dynamo guards on its value and recompiles on every call.
    """

    @functools.wraps(forward)  # keeps the name, docstring and inspect.signature of `forward`
    def ranged_forward(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return forward(*args, **kwargs)
        _push(token, _HANDLE)
        try:
            return forward(*args, **kwargs)
        finally:
            _pop(_HANDLE)

    ranged_forward.graphrt_nvtx = True  # marks it for attach's check
    return ranged_forward


def _unwrap(module: nn.Module, wrapper: Callable[..., Any],
            previous: Callable[..., Any] | None) -> None:
    """Undo one wrap, if graphrt's wrapper is still the module's `forward`; if someone wrapped it
    again since, their `forward` (which calls graphrt's) stays: removing it would drop theirs."""
    if vars(module).get("forward") is not wrapper:
        return
    if previous is None:
        del module.forward
    else:
        module.forward = previous


def is_attached(model: nn.Module) -> bool:
    """Are graphrt's ranges attached to `model` (its root module) now?"""
    return getattr(vars(model).get("forward"), "graphrt_nvtx", False)


def attach(model: nn.Module) -> ModuleRanges:
    """Wrap every call of every submodule of `model` (the root too) in one NVTX range.

    Each module gets an instance attribute `forward` that opens its range, calls what `forward`
    was (the class's method, or an instance-level `forward` someone set before) and closes the
    range, even when the module raises. The range covers `forward` only: the module's own hooks
    run just outside it, in the caller's range.

    Why not forward hooks: registering any hook sends every call of that module down
    `nn.Module._call_impl`'s slow path, several microseconds per call (module docstring);
    a wrapped `forward` keeps the fast path. When graphrt's ranges are switched off
    (`set_enabled(False)`) nothing is attached and the handle removes nothing. Attaching twice
    to the same model raises ValueError: it would nest two ranges per call.
    """
    if not _enabled:
        return ModuleRanges([], [])
    wrapped: list[_Wrapped] = []
    names: list[str] = []
    for qualname, module in model.named_modules():
        previous = vars(module).get("forward")
        if getattr(previous, "graphrt_nvtx", False):
            ModuleRanges(wrapped, names).remove()
            raise ValueError(f"graphrt NVTX ranges are already attached to "
                             f"{qualname or 'the model'}")
        name = module_range_name(qualname, module)
        color = KIND_COLORS[kind_of(qualname, module)]
        wrapper = _ranged(module.forward, _token(name, color))
        module.forward = wrapper
        wrapped.append((module, wrapper, previous))
        names.append(name)
    return ModuleRanges(wrapped, names)


# ---------------------------------------------------------------------------------------------
# Named ranges


class _Range:
    """A reusable, re-entrant range for one name (it holds no state between enter and exit)."""

    __slots__ = ("token",)

    def __init__(self, token: Any):
        self.token = token

    def __enter__(self) -> None:
        _push(self.token, _HANDLE)

    def __exit__(self, *exc: object) -> bool:
        _pop(_HANDLE)
        return False


_ranges: dict[str, _Range] = {}
_NO_RANGE = contextlib.nullcontext()


def nvtx_range(name: str) -> contextlib.AbstractContextManager[None]:
    """`with nvtx_range("replay[bs=8]"): ...`: one NVTX range around the block.

    Coloured by the name's stem (`replay`); attributes are registered on a name's first use and
    cached. With ranges switched off, or under torch.compile (a range inside a compiled module,
    as a row-parallel linear's all-reduce has: see `_ranged`), this returns a shared
    do-nothing context.
    """
    if _is_compiling() or not _enabled:
        return _NO_RANGE
    rng = _ranges.get(name)
    if rng is None:
        color = STEP_COLORS.get(name.partition("[")[0], DEFAULT_STEP_COLOR)
        rng = _ranges[name] = _Range(_token(name, color))
    return rng


# ---------------------------------------------------------------------------------------------
# Observing ranges without a profiler


@contextlib.contextmanager
def record_to(events: list[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    """While open, append `("push", name)` / `("pop", name)` to `events` for every graphrt range
    (the ranges still go to NVTX too). A pop is named after the innermost open range.

    It swaps the functions the module wrappers and named ranges call and restores them on exit,
    so the path without a recorder has no check for one. Recorders nest.
    """
    global _push, _pop
    inner_push, inner_pop = _push, _pop
    stack: list[str] = []

    def push(token: Any, handle: Any) -> None:
        name = _names[token]
        stack.append(name)
        events.append(("push", name))
        inner_push(token, handle)

    def pop(handle: Any) -> None:
        events.append(("pop", stack.pop() if stack else "<unmatched>"))
        inner_pop(handle)

    _push, _pop = push, pop
    try:
        yield events
    finally:
        _push, _pop = inner_push, inner_pop


Scope = Callable[[tuple[str, ...]], contextlib.AbstractContextManager[Any]]


class _ScopeSink:
    """A `record_to` sink that mirrors graphrt's ranges into other scopes: at each push it enters
    `open_scope(stack)` (the ranges open now, outermost first, the pushed one last), at each pop
    it exits the innermost scope it entered. Pops of ranges opened before it are ignored."""

    def __init__(self, open_scope: Scope) -> None:
        self.stack: list[str] = []
        self._open_scope = open_scope
        self._entered: list[contextlib.AbstractContextManager[Any]] = []

    def append(self, event: tuple[str, str]) -> None:
        kind, name = event
        if kind == "push":
            self.stack.append(name)
            scope = self._open_scope(tuple(self.stack))
            scope.__enter__()
            self._entered.append(scope)
        elif self.stack:
            self.stack.pop()
            self._entered.pop().__exit__(None, None, None)


@contextlib.contextmanager
def mirror_ranges(open_scope: Scope) -> Iterator[list[str]]:
    """While open, every graphrt range opened inside the block also opens `open_scope(stack)`,
    closed when the range closes: `stack` is the tuple of ranges then open, outermost first,
    itself last. Yields the list of ranges open at each moment (see `open_ranges`).

    This is how a range becomes a torch.profiler `record_function` (graphrt.trace.record.record_modes) or a
    CUDA graph-node annotation (graphrt.graphs.annotate). A scope should not raise: it runs
    inside the module whose range opened it.
    """
    sink = _ScopeSink(open_scope)
    with record_to(sink):  # type: ignore[arg-type]
        yield sink.stack


@contextlib.contextmanager
def open_ranges() -> Iterator[list[str]]:
    """While open, the yielded list holds the names of the graphrt ranges open at this moment,
    outermost first: `["(Qwen2ForCausalLM)", "model (Qwen2Model)", ...]`. Only ranges opened
    inside the block are there.

    The list changes as ranges open and close; copy it (`tuple(stack)`) to keep a moment. This is
    how a capture knows the module each op was issued in, which a replay cannot tell.
    """
    with mirror_ranges(lambda stack: _NO_RANGE) as stack:
        yield stack


# ---------------------------------------------------------------------------------------------
# Will a profiler see the ranges?


def profiler_attached(environ: Mapping[str, str] | None = None) -> bool:
    """True when an NVTX tool (Nsight Systems, for one) has injected itself into this process."""
    env = os.environ if environ is None else environ
    return any(env.get(var) for var in PROFILER_ENV_VARS)


def domain_is_dummy(domain: object | None = None) -> bool:
    """True when `domain` (by default graphrt's) is nvtx's DummyDomain, which drops every range.

    nvtx >= 0.2.12 hands one out when the attached tool does not report the domain enabled, as
    Nsight Systems 2022.4 does not; nvtx 0.2.11 never does.
    """
    domain = _DOMAIN if domain is None else domain
    return _DummyDomain is not None and isinstance(domain, _DummyDomain)


def check_recording(environ: Mapping[str, str] | None = None,
                    domain: object | None = None) -> str | None:
    """A one-line warning when a profiler is attached but graphrt's ranges will not reach it;
    None when they will, or when no profiler is attached."""
    if not (profiler_attached(environ) and domain_is_dummy(domain)):
        return None
    try:
        installed = version("nvtx")
    except PackageNotFoundError:
        installed = "(unknown version)"
    return (f"nvtx {installed} hands this profiler a DummyDomain: no ranges will be recorded; "
            "install nvtx==0.2.11")
