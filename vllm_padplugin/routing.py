"""Per-router masking: make one router's ``_compute_routing`` result skip padded rows.

Why ``_compute_routing``: it is where upstream (vLLM PR #56079, 0.31+) masks, i.e.
before routing capture and EPLB logical->physical mapping, so captured routes and
EPLB load statistics never count padding.  We shadow the method on the router
INSTANCE (not the class): routers that were not asked to skip padding, and every
other router class, stay exactly upstream's.

Everything that depends on the environment (env var, parallel config, strict mode)
is read once, when the router is built.  The per-call path only reads the forward
context and calls the pure-torch ``mask_padded_routes``: no I/O, no Python side
effects, so ``torch.compile`` can trace it like upstream's own masked_fill.

Bad mask at call time (``PaddingMaskError``: wrong dtype/device, shorter than the
batch): one warning per process and the UNMASKED routes are returned; with
``PADPLUGIN_STRICT=1`` it raises.  Why not raise by default: an unmaskable
batch routed like upstream (padding reaches experts, as on a vLLM without the
plugin) is a performance loss; an exception kills the serving engine.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from vllm_padplugin import state, surface
from vllm_padplugin.state import warn_once
from vllm_padplugin.masking import PaddingMaskError, mask_padded_routes

logger = logging.getLogger("vllm_padplugin")

ENV = surface.get("skip_padding_env").qualname  # VLLM_MOE_SKIP_PADDING
_OFF = {"0", "false", "no", "off"}
_ON = {"1", "true", "yes", "on"}
MASKED_ATTR = "_padplugin_masks_padding"




def skip_padding_env_enabled() -> bool:
    """``VLLM_MOE_SKIP_PADDING`` as upstream means it (default on); garbage -> one warning, on.

    Parsed here rather than through ``vllm.envs`` because upstream's ``bool(int(...))``
    raises on garbage, which would take model building down.
    """
    sym = surface.get("skip_padding_env")
    raw = os.environ.get(ENV)
    if raw is None:
        return (sym.default or "1") not in _OFF
    val = raw.strip().lower()
    if val in _OFF:
        return False
    if val in _ON:
        return True
    try:
        return int(val) != 0
    except ValueError:
        warn_once(
            "env-garbage",
            "vllm_padplugin: %s=%r is not 0/1; using the default (on: padded rows are masked)",
            ENV,
            raw,
        )
        return True


def deepep_v2_active(vllm_config: Any = None) -> bool:
    """Whether MoE layers of the current vLLM config use DeepEP v2 all2all kernels.

    Evaluates vLLM's own ``FusedMoEParallelConfig.use_deepep_v2_kernels`` on a
    config filled from ``ParallelConfig`` (``FusedMoEParallelConfig.make`` itself
    needs initialised process groups, which a model build has but a check may not);
    falls back to the same rule written out when that class changed.
    """
    if vllm_config is None:
        try:
            from vllm.config import get_current_vllm_config

            vllm_config = get_current_vllm_config()
        except Exception:  # no config at all: nothing can be DeepEP v2
            return False
    pc = getattr(vllm_config, "parallel_config", None)
    if pc is None:
        return False
    tp = int(getattr(pc, "tensor_parallel_size", 1) or 1)
    dp = int(getattr(pc, "data_parallel_size", 1) or 1)
    pcp = int(getattr(pc, "prefill_context_parallel_size", 1) or 1)
    sp = tp if getattr(pc, "use_sequence_parallel_moe", False) else 1
    use_ep = dp * pcp * tp > 1 and bool(getattr(pc, "enable_expert_parallel", False))
    backend = getattr(pc, "all2all_backend", None)
    values = dict(
        tp_size=tp, pcp_size=pcp, dp_size=dp, ep_size=dp * pcp * tp if use_ep else 1,
        tp_rank=0, pcp_rank=0, dp_rank=0, ep_rank=0, sp_size=sp, use_ep=use_ep,
        all2all_backend=backend, enable_eplb=bool(getattr(pc, "enable_eplb", False)),
    )
    try:
        import dataclasses

        prop = surface.get("use_deepep_v2_kernels")
        cls = _class_of(prop)
        if cls is not None:
            kwargs = {}
            for f in dataclasses.fields(cls):
                if f.name in values:
                    kwargs[f.name] = values[f.name]
                elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    kwargs[f.name] = 0  # a new required field: neutral value
            return bool(getattr(cls(**kwargs), prop.qualname.split(".")[-1]))
    except Exception as exc:  # class changed shape: use the rule as of 0.28-0.34
        warn_once("deepep-fallback", "vllm_padplugin: use_deepep_v2_kernels not evaluable (%s); "
                  "using all2all_backend == 'deepep_v2' with expert parallel", exc)
    all2all = use_ep and (dp > 1 or pcp > 1 or sp > 1)
    return all2all and backend == "deepep_v2"


def _class_of(sym: surface.Symbol) -> type | None:
    import importlib

    try:
        return getattr(importlib.import_module(sym.module), sym.qualname.split(".")[0])
    except (ImportError, AttributeError):
        return None


def is_grouped_router(router: Any) -> bool:
    """Upstream's masking scope: grouped top-k routers (and subclasses)."""
    from vllm_padplugin.platforms import resolve

    cls = resolve("grouped_topk_router")
    return isinstance(cls, type) and isinstance(router, cls)


def _context_reader():
    """(is_forward_context_available or None, get_forward_context), resolved once."""
    from vllm_padplugin.platforms import resolve

    return resolve("is_forward_context_available"), resolve("get_forward_context")


def install_mask(router: Any) -> bool:
    """Shadow ``router._compute_routing`` with a version that masks padded rows.

    Idempotent (a router is wrapped once).  Returns False when the router has no
    ``_compute_routing`` or the forward context API is gone (one warning).
    """
    if getattr(router, MASKED_ATTR, False):
        return True
    inner = getattr(router, "_compute_routing", None)
    available, get_ctx = _context_reader()
    if inner is None or get_ctx is None:
        warn_once("no-routing-api", "vllm_padplugin: %s has no _compute_routing or vLLM has no "
                  "get_forward_context; padded rows are not masked", type(router).__name__)
        return False
    strict = state.strict()

    def _compute_routing(*args: Any, **kwargs: Any):
        topk_weights, topk_ids = inner(*args, **kwargs)
        if available is not None:
            if not available():
                return topk_weights, topk_ids
            ctx = get_ctx()
        else:
            try:
                ctx = get_ctx()
            except (AssertionError, RuntimeError):
                return topk_weights, topk_ids
        is_padding = getattr(ctx, "is_padding", None)
        if is_padding is None:
            return topk_weights, topk_ids
        try:
            return mask_padded_routes(topk_weights, topk_ids, is_padding)
        except PaddingMaskError as exc:
            if strict:
                raise
            warn_once("bad-mask", "vllm_padplugin: padding mask unusable (%s); routing this "
                      "batch without masking, as upstream would", exc)
            return topk_weights, topk_ids

    _compute_routing.__wrapped__ = inner  # type: ignore[attr-defined]
    router._compute_routing = _compute_routing
    setattr(router, MASKED_ATTR, True)
    return True
