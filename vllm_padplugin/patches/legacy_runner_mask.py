"""Backport: the legacy GPU runner fills ``ForwardContext.is_padding`` (vLLM < 0.31).

Why
    Before vLLM 0.31 the legacy runner (``vllm/v1/worker/gpu_model_runner.py``)
    never sets ``is_padding`` in its forward context, so no router can tell padded
    rows (CUDA-graph sizes, SP padding, DP dummy batches) from real ones and DeepEP
    v2 dispatches them.  Upstream fixed it in PR #56079 with a persistent
    ``self.is_padding`` buffer, ``_prepare_padding_mask`` and ``is_padding=`` in the
    two ``set_forward_context`` calls (``execute_model`` and ``_dummy_run``).
How
    Wrap, don't copy.  ``execute_model`` and ``_dummy_run`` are wrapped (wrapt) to
    publish, in a context variable, the runner's persistent ``PaddingMask`` (one
    bool buffer of ``max_num_tokens`` rows on the runner's device, allocated on
    the first step, outside any graph capture) and the step's unpadded count
    (``scheduler_output.total_num_scheduled_tokens``; a dummy run is all padding,
    a profile run has none, as upstream).  The name ``set_forward_context`` bound
    in the runner's module is wrapped to fill the mask in place (two ``fill_`` on
    views: no sync, no allocation, same address every step, so captured graphs
    read it) and pass it as ``is_padding``.  Chosen over wrapping the whole of
    ``execute_model``'s body because the unpadded count is known only inside it,
    and over a subclass because vLLM picks the runner class itself.  Only classes
    lacking ``_prepare_padding_mask`` are touched (capability, not version), and
    only after the module is imported (post-import hook): it is importable on the
    CPU build but only patched on CUDA.
Related PR
    vLLM PR #56079 (released in 0.31).
Future plan
    Remove when the lowest supported vLLM is >= 0.31 (tests marked ``compat`` fail
    then, as a reminder).  The legacy runner itself is gone in 0.34.
"""
from __future__ import annotations

import contextvars
import inspect
import logging
import operator
from dataclasses import dataclass

from vllm_padplugin import surface
from vllm_padplugin.state import warn_once
from vllm_padplugin.compat_utils import accepts_kwarg
from vllm_padplugin.patches.base import Patch, apply_on_import, cuda_backport_only

logger = logging.getLogger(__name__)

RUNNER = surface.get("legacy_runner")
SET_CONTEXT = surface.get("set_forward_context")
NATIVE_METHOD = "_prepare_padding_mask"     # present from 0.31: upstream fills the mask itself
WRAPPED_METHODS = ("execute_model", "_dummy_run")
MASK_ATTR = "_padplugin_is_padding"         # the runner's persistent PaddingMask



@dataclass(frozen=True)
class _Step:
    mask: object                 # PaddingMask
    num_unpadded: int | None     # None: nothing is padding (profile run)


_STEP: contextvars.ContextVar[_Step | None] = contextvars.ContextVar(
    "padplugin_legacy_runner_step", default=None
)




def runner_fills_mask(cls) -> bool:
    """Upstream's runner fills is_padding itself (0.31+)."""
    return hasattr(cls, NATIVE_METHOD)


def runner_mask(runner):
    """The runner's persistent mask, allocated once (never inside a graph capture)."""
    mask = runner.__dict__.get(MASK_ATTR)
    if mask is None:
        import torch

        from vllm_padplugin.padding_mask import PaddingMask

        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            warn_once("legacy:capture", "vllm_padplugin: first forward ran under CUDA graph capture; "
                       "the padding mask is not allocated there, this forward is not masked")
            return None
        mask = PaddingMask(int(runner.max_num_tokens), runner.device)
        setattr(runner, MASK_ATTR, mask)
    return mask


def _in_step(wrapped, runner, args, kwargs, num_unpadded):
    try:
        mask = runner_mask(runner)
    except Exception as e:  # a plugin problem never takes the runner down
        warn_once("legacy:alloc", "vllm_padplugin: cannot allocate the padding mask (%s); forwards are not masked", e)
        mask = None
    if mask is None:
        return wrapped(*args, **kwargs)
    token = _STEP.set(_Step(mask, num_unpadded))
    try:
        return wrapped(*args, **kwargs)
    finally:
        _STEP.reset(token)


def _execute_model(wrapped, instance, args, kwargs):
    scheduler_output = args[0] if args else kwargs.get("scheduler_output")
    try:
        n = operator.index(getattr(scheduler_output, "total_num_scheduled_tokens"))
    except (AttributeError, TypeError):
        warn_once("legacy:sched", "vllm_padplugin: execute_model() got no total_num_scheduled_tokens; not masked")
        return wrapped(*args, **kwargs)
    return _in_step(wrapped, instance, args, kwargs, n)


def _dummy_run(wrapped, instance, args, kwargs):
    try:
        is_profile = bool(inspect.signature(wrapped).bind(*args, **kwargs).arguments.get("is_profile", False))
    except TypeError:
        return wrapped(*args, **kwargs)   # let upstream raise its own error
    # As upstream (0.31): a profile run has no padding, any other dummy run is all padding.
    return _in_step(wrapped, instance, args, kwargs, None if is_profile else 0)


def _make_set_forward_context_wrapper(original):
    sig = inspect.signature(original)

    def wrapper(wrapped, instance, args, kwargs):
        step = _STEP.get()
        if step is None or kwargs.get("is_padding") is not None:
            return wrapped(*args, **kwargs)
        if "num_tokens" in kwargs or len(args) <= 2:
            num_tokens, slices = kwargs.get("num_tokens"), kwargs.get("ubatch_slices")
        else:
            bound = sig.bind_partial(*args, **kwargs).arguments
            num_tokens, slices = bound.get("num_tokens"), bound.get("ubatch_slices")
        from vllm_padplugin.padding_mask import padded_length

        padded = padded_length(num_tokens, [s.token_slice for s in slices or ()])
        if padded is None or not step.mask.fits(padded):
            warn_once("legacy:fit", "vllm_padplugin: forward of %s tokens does not fit the padding mask (%s rows); "
                       "not masked", padded, step.mask.capacity)
            return wrapped(*args, **kwargs)
        unpadded = padded if step.num_unpadded is None else step.num_unpadded
        kwargs["is_padding"] = step.mask.prepare(unpadded, padded)
        return wrapped(*args, **kwargs)

    return wrapper


def _is_ours(obj) -> bool:
    return getattr(obj, "_self_padplugin", False) is True


def _wrap(parent, name: str, wrapper) -> None:
    import wrapt

    proxy = wrapt.FunctionWrapper(inspect.getattr_static(parent, name), wrapper)
    proxy._self_padplugin = True
    setattr(parent, name, proxy)


def patch_legacy_runner(module, cls=None) -> list[str]:
    """Patch the imported runner module (``cls`` defaults to its GPUModelRunner).

    Returns the sites changed; ``[]`` when upstream fills the mask itself or when
    already patched.  Raises ``AttributeError`` when the expected symbols are gone.
    """
    cls = cls if cls is not None else getattr(module, RUNNER.qualname)
    if runner_fills_mask(cls):
        return []
    original = getattr(module, SET_CONTEXT.qualname)
    if not accepts_kwarg(original, "is_padding"):
        raise AttributeError(f"{module.__name__}.{SET_CONTEXT.qualname} takes no is_padding")
    sites = []
    for name in WRAPPED_METHODS:
        wrapper = _execute_model if name == "execute_model" else _dummy_run
        if not _is_ours(inspect.getattr_static(cls, name)):
            _wrap(cls, name, wrapper)
            sites.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    if not _is_ours(original):
        _wrap(module, SET_CONTEXT.qualname, _make_set_forward_context_wrapper(original))
        sites.append(f"{module.__name__}.{SET_CONTEXT.qualname}")
    return sites


APPLIED: list[str] = []   # sites patched so far in this process (for the report)


PATCH = Patch(
    name="legacy_runner_mask",
    surface_keys=("legacy_runner", "set_forward_context", "forward_context_is_padding"),
    why="vLLM < 0.31: the legacy GPU runner never fills ForwardContext.is_padding, so padded "
    "rows are indistinguishable and DeepEP v2 dispatches them.",
    how="Wrap execute_model/_dummy_run (context variable with the step's unpadded count and the "
    "runner's persistent mask) and the runner module's set_forward_context (fill in place, pass "
    "is_padding). Only when the runner lacks _prepare_padding_mask; lazily on import.",
    related_pr="vLLM PR #56079 (0.31)",
    future_plan="Remove when the lowest supported vLLM is >= 0.31.",
    needed=cuda_backport_only,
    apply=apply_on_import(RUNNER.module, patch_legacy_runner, APPLIED, "legacy runner padding-mask"),
)
