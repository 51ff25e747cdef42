"""Backport: DBO micro-batch forward contexts carry their slice of ``is_padding`` (vLLM < 0.31).

Why
    With dual-batch overlap the legacy runner's ``UBatchWrapper`` runs each
    micro-batch under its own forward context, built in ``_make_ubatch_metadata``
    by ``create_forward_context``.  Before 0.31 those contexts get no ``is_padding``,
    so even with the outer mask filled (see ``legacy_runner_mask``) every
    micro-batch's padded rows reach the experts.
How
    Wrap, don't copy: ``UBatchWrapper._make_ubatch_metadata`` is wrapped (wrapt);
    after upstream builds the micro-batch contexts, each one whose ``is_padding``
    is None gets ``outer.is_padding[ubatch_slice.token_slice]`` (a view of the
    runner's persistent buffer, so a captured micro-batch graph keeps reading the
    refilled mask on replay).  The outer context is the current one: upstream calls
    the builder inside the runner's ``set_forward_context``.  Setting the field on
    the returned contexts is smaller than re-implementing the builder and never
    overrides a mask upstream set.  Applied only when the builder lacks an
    ``is_padding`` parameter (capability, not version), lazily on import.
    The v2 runner's DBO (``vllm/v1/worker/gpu/ubatch_utils.py``) needs nothing: it
    does not exist in 0.28/0.29 (no v2 DBO there) and propagates natively from 0.30.
Related PR
    vLLM PR #56079 (released in 0.31).
Future plan
    Remove when the lowest supported vLLM is >= 0.31 (tests marked ``compat`` fail
    then).  ``gpu_ubatch_wrapper.py`` itself is gone in 0.34.
"""
from __future__ import annotations

import inspect
import logging

from vllm_padplugin import surface
from vllm_padplugin.state import warn_once
from vllm_padplugin.patches.base import Patch, apply_on_import, cuda_backport_only
from vllm_padplugin.compat_utils import has_argument
from vllm_padplugin.patches.legacy_runner_mask import _is_ours, _wrap

logger = logging.getLogger(__name__)

BUILDER = surface.get("dbo_mask_propagation_legacy")     # UBatchWrapper._make_ubatch_metadata
V2_BUILDER = surface.get("dbo_mask_propagation_v2")
CLASS_NAME, METHOD = BUILDER.qualname.split(".")





def builder_propagates(cls) -> bool:
    """Upstream's micro-batch builder takes the mask itself (0.31+)."""
    return has_argument(getattr(cls, METHOD), "is_padding")


def propagate(ubatch_metadata, ubatch_slices, is_padding) -> int:
    """Give each micro-batch context without a mask its slice of ``is_padding``; returns how many."""
    from vllm_padplugin.padding_mask import micro_batch_mask

    if is_padding is None:
        return 0
    done = 0
    for meta, ubatch_slice in zip(ubatch_metadata, ubatch_slices, strict=True):
        ctx = meta.context.forward_context
        if ctx.is_padding is None:
            ctx.is_padding = micro_batch_mask(is_padding, ubatch_slice.token_slice)
            done += 1
    return done


def _make_ubatch_metadata(wrapped, instance, args, kwargs):
    metadata = wrapped(*args, **kwargs)
    try:
        from vllm_padplugin.platforms import resolve

        get_forward_context = resolve("get_forward_context")
        is_forward_context_available = resolve("is_forward_context_available")

        if is_forward_context_available():
            slices = args[0] if args else kwargs["ubatch_slices"]
            propagate(metadata, slices, get_forward_context().is_padding)
    except Exception as e:  # never take the forward down over the mask
        warn_once("dbo:propagate", "vllm_padplugin: DBO micro-batches not masked: %s", e)
    return metadata


def patch_ubatch_wrapper(module, cls=None) -> list[str]:
    """Patch the imported wrapper module; ``[]`` when upstream propagates or already patched."""
    cls = cls if cls is not None else getattr(module, CLASS_NAME)
    if builder_propagates(cls) or _is_ours(inspect.getattr_static(cls, METHOD)):
        return []
    _wrap(cls, METHOD, _make_ubatch_metadata)
    return [f"{cls.__module__}.{cls.__qualname__}.{METHOD}"]


APPLIED: list[str] = []


PATCH = Patch(
    name="dbo_mask",
    surface_keys=("dbo_mask_propagation_legacy", "create_forward_context", "forward_context_is_padding"),
    why="vLLM < 0.31: DBO micro-batch forward contexts are built without is_padding, so each "
    "micro-batch's padded rows reach the experts.",
    how="Wrap UBatchWrapper._make_ubatch_metadata; set outer.is_padding[token_slice] on each "
    "returned micro-batch context that has none. Only when the builder lacks is_padding; lazily.",
    related_pr="vLLM PR #56079 (0.31)",
    future_plan="Remove when the lowest supported vLLM is >= 0.31.",
    needed=cuda_backport_only,
    apply=apply_on_import(BUILDER.module, patch_ubatch_wrapper, APPLIED, "DBO padding-mask"),
)
