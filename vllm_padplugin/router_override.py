"""Our ``create_fused_moe_router``: a wrapper (never a copy) around whatever factory is installed.

Signature parity: ``inspect.signature(wrapper)`` is the installed upstream factory's
signature, plus ``skip_padding: bool = False`` when upstream lacks it (vLLM 0.28-0.30),
so callers of every release, and callers passing ``skip_padding`` on any release,
bind exactly as they would upstream (a wrong call is the same TypeError).

The wrapped factory (upstream's, or another plugin's replacement such as vllm-gaudi's)
is called with only the arguments it accepts: ``skip_padding`` is dropped for a
factory that does not know it (we then mask ourselves where upstream would have),
an argument a foreign factory lacks is dropped with one warning, and a future
argument upstream adds passes straight through because our signature is upstream's.
"""
from __future__ import annotations

import functools
import inspect
import logging
import threading
import types
from typing import Any, Callable

from vllm_padplugin import routing, state, surface
from vllm_padplugin.compat_utils import accepts_kwarg, innermost, split_call, with_parameter
from vllm_padplugin.marks import FACTORY_MARK, is_ours

logger = logging.getLogger("vllm_padplugin")

SKIP = "skip_padding"
FACTORY_NAME = surface.get("router_factory").qualname
FACTORY_MODULE = surface.get("router_factory").module

_nesting = threading.local()  # >0 while one of our wrappers is building a router


def is_upstream_factory(func: Any) -> bool:
    """The function defined in upstream's router_factory module (not a wrapper), at the
    registry's path or where the installed vLLM moved it (``relocate``)."""
    from vllm_padplugin import relocate

    return (
        isinstance(func, types.FunctionType)
        and func.__module__ in (FACTORY_MODULE, relocate.module_of("router_factory"))
        and func.__qualname__ == FACTORY_NAME
        and not is_ours(func)
    )


def override_signature(upstream: inspect.Signature) -> inspect.Signature:
    """Pure: upstream's signature plus ``skip_padding: bool = False`` when missing."""
    return with_parameter(upstream, SKIP, False, bool)


def upstream_of(inner: Callable, candidates: tuple[Callable, ...] = ()) -> Callable:
    """The upstream factory behind ``inner`` (via ``__wrapped__``) or among ``candidates``;
    ``inner`` itself when neither reveals it (a foreign factory that does not use functools.wraps)."""
    for f in (innermost(inner), *map(innermost, candidates)):
        if is_upstream_factory(f):
            return f
    for f in (inner, *candidates):  # a foreign wrapper that kept upstream's in a closure/global
        found = _referenced_upstream(innermost(f))
        if found is not None:
            return found
    return inner


def _referenced_upstream(func: Any) -> Callable | None:
    """Upstream's factory held in ``func``'s closure cells or module globals, if any."""
    if not isinstance(func, types.FunctionType):
        return None
    cells = []
    for cell in func.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # empty cell
            continue
    for value in (*cells, *func.__globals__.values()):
        if is_upstream_factory(value):
            return value
    return None


def should_mask(
    *, mode: str, requested: bool | None, inner_masks: bool, deepep_v2: bool, env_on: bool, grouped: bool
) -> bool:
    """Pure masking decision for one router (the contract of vLLM PR #56079).

    ``requested`` None means the caller predates ``skip_padding`` (0.28-0.30 layers):
    in backport mode that is "auto" (requested for grouped routers under DeepEP v2),
    in native mode it means not requested, as upstream's default.
    """
    if mode not in ("native", "backport") or inner_masks:
        return False
    if requested is None:
        requested = mode == "backport"
    return bool(requested) and deepep_v2 and env_on and grouped


def _mode() -> str:
    if state.STATE.mode is None:
        from vllm_padplugin.platforms import decide_mode

        state.STATE.mode = decide_mode()
    return state.STATE.mode


def wrap_factory(inner: Callable, upstream: Callable | None = None) -> Callable:
    """Return our factory around ``inner`` (idempotent: ours is returned unchanged)."""
    if is_ours(inner):
        return inner
    upstream = upstream or upstream_of(inner)
    sig = override_signature(inspect.signature(upstream))
    inner_sig = inspect.signature(inner)
    inner_takes_skip = accepts_kwarg(inner, SKIP)

    @functools.wraps(inner)
    def create_fused_moe_router(*args: Any, **kwargs: Any) -> Any:
        pos, kw = split_call(sig, args, kwargs)
        requested = kw.get(SKIP)
        if _mode() == "hpu-noop":  # HPU has no DeepEP v2: accepted, never acted on
            kw.pop(SKIP, None)
        for name in [k for k in kw if not _accepts(inner, inner_sig, k)]:
            if name != SKIP:
                state.warn_once(f"drop-{name}", "vllm_padplugin: the installed router factory "
                                  "%s does not accept %r; dropping it", _name(inner), name)
            del kw[name]
        depth = getattr(_nesting, "depth", 0)
        _nesting.depth = depth + 1
        try:
            router = inner(*pos, **kw)
        finally:
            _nesting.depth = depth
        if depth == 0:  # the outermost of our wrappers decides (another plugin may sit between two)
            _after_build(router, requested, inner_masks=inner_takes_skip and SKIP in kw)
        return router

    create_fused_moe_router.__signature__ = sig  # type: ignore[attr-defined]
    setattr(create_fused_moe_router, FACTORY_MARK, True)
    create_fused_moe_router.__padplugin_inner__ = inner  # type: ignore[attr-defined]
    return create_fused_moe_router


def _accepts(inner: Callable, inner_sig: inspect.Signature, name: str) -> bool:
    if name in inner_sig.parameters:
        return True
    if name == SKIP:
        return accepts_kwarg(inner, SKIP)
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inner_sig.parameters.values())


def _name(f: Callable) -> str:
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"


def _after_build(router: Any, requested: bool | None, inner_masks: bool) -> None:
    """Count, decide, maybe mask, rewrite the report file. Model-build time only."""
    st = state.STATE
    try:
        with state.LOCK:
            first = st.factory_calls == 0
            st.factory_calls += 1
            cls = type(router).__name__
            st.routers_built[cls] = st.routers_built.get(cls, 0) + 1
            if requested:
                st.skip_padding_requested += 1
        mode = _mode()
        if mode in ("native", "backport") and not inner_masks:
            grouped = routing.is_grouped_router(router)
            if grouped and should_mask(
                mode=mode,
                requested=requested,
                inner_masks=inner_masks,
                deepep_v2=routing.deepep_v2_active(),
                env_on=routing.skip_padding_env_enabled(),
                grouped=grouped,
            ) and routing.install_mask(router):
                with state.LOCK:
                    st.masked_routers += 1
        elif mode == "native" and inner_masks and routing.is_grouped_router(router):
            routing.adopt_native(router)  # patch native_fast_mask: one launch, not two
        if first:  # every binding site of this model is imported by now: guard + record them
            from vllm_padplugin.binding_sites import guard_holders

            guard_holders(is_ours)
        from vllm_padplugin.report import write_report_file

        write_report_file()
    except Exception as exc:  # never fail a model build for our bookkeeping
        if state.strict():
            raise
        state.warn_once("after-build", "vllm_padplugin: post-processing a router failed (%s: %s); "
                          "the router is upstream's, unmasked", type(exc).__name__, exc)
