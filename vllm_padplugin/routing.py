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

Fast path (CUDA): padded rows are masked IN PLACE by one launch of our Triton kernel
(``padplugin::mask_padded_routes_``, a torch custom op so compiled graphs hold it);
elsewhere, or when Triton is missing or its one-time probe fails (one warning), by
torch's ``masked_fill_`` pair -- same results.  ``PADPLUGIN_MASK_KERNEL=torch`` forces
the torch path.  ``PADPLUGIN_FUSED_TOPK=1`` (opt-in) replaces the whole grouped top-k of
sigmoid routers by the fused Triton kernel with the mask folded in (float32 logits
only; other calls take upstream's routing + the mask).  ``select_mask_impl`` /
``fused_topk_wanted`` decide, once per router build.

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
from vllm_padplugin.masking import PaddingMaskError, check_mask, mask_padded_routes

logger = logging.getLogger("vllm_padplugin")

ENV = surface.get("skip_padding_env").qualname  # VLLM_MOE_SKIP_PADDING
_OFF = {"0", "false", "no", "off"}
_ON = {"1", "true", "yes", "on"}
MASKED_ATTR = "_padplugin_masks_padding"
IMPL_ATTR = "_padplugin_mask_impl"     # "triton" | "torch" (which masking this router uses)
FUSED_ATTR = "_padplugin_fused_topk"   # True when the fused grouped top-k replaced routing
MASK_KERNEL_ENV = "PADPLUGIN_MASK_KERNEL"  # auto (default) | triton | torch
FUSED_TOPK_ENV = "PADPLUGIN_FUSED_TOPK"    # 1: opt in to the fused grouped top-k
_PROBE: dict[str, object] = {}             # device -> probe result (one probe per process)




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
            from vllm_padplugin.platforms import resolve

            vllm_config = resolve("get_current_vllm_config")()   # vllm.config, or its new home
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

    from vllm_padplugin import relocate

    sym = relocate.where(sym.key)
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


def _cuda_serving() -> bool:
    """The process serves on CUDA (the platform the fast path is for)."""
    dt = state.STATE.device_type
    if dt is None:
        try:
            from vllm_padplugin.platforms import current_device_type

            dt = current_device_type()
        except Exception:
            dt = ""
    import torch

    return dt == "cuda" and torch.cuda.is_available()


def _probe_triton(device: str) -> str | None:
    """Run the mask kernel once on ``device`` against torch's result; None = OK, else why not.

    Once per process (a host sync at model build, never per call).  Catches a Triton
    that imports but cannot compile or launch here (driver/toolchain mismatch).
    """
    if device in _PROBE:
        return _PROBE[device]  # type: ignore[return-value]
    import torch

    from vllm_padplugin.kernels import ops  # noqa: F401  (registers the op)
    from vllm_padplugin.kernels.triton_mask import mask_padded_routes_inplace

    why: str | None = None
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        w = torch.rand(37, 8, generator=g).to(device)
        ids = torch.randint(0, 256, (37, 8), generator=g, dtype=torch.int32).to(device)
        pad = (torch.rand(64, generator=g) < 0.5).to(device)
        ew, eids = mask_padded_routes(w, ids, pad)
        mask_padded_routes_inplace(w, ids, pad)
        if not (torch.equal(w, ew) and torch.equal(ids, eids)):
            why = "the Triton mask kernel gave a result different from torch's"
    except Exception as exc:  # compile / launch failure
        why = f"the Triton mask kernel failed ({type(exc).__name__}: {exc})"
    _PROBE[device] = why
    return why


def select_mask_impl(on_cuda: bool | None = None) -> str:
    """``"triton"`` or ``"torch"``: how this process's routers mask (decided per router build).

    CUDA + Triton + passing probe -> triton.  Not on CUDA -> torch, silently (nothing to
    speed up; CPU/HPU keep the torch core).  On CUDA without Triton, with a failing probe,
    or ``PADPLUGIN_MASK_KERNEL=torch`` -> torch; the first two give ONE warning.
    """
    from vllm_padplugin.kernels.triton_mask import HAS_TRITON

    want = os.environ.get(MASK_KERNEL_ENV, "auto").strip().lower() or "auto"
    if want not in ("auto", "triton", "torch"):
        warn_once("mask-kernel-env", "vllm_padplugin: %s=%r is not auto/triton/torch; using auto",
                  MASK_KERNEL_ENV, want)
        want = "auto"
    if want == "torch":
        return "torch"
    if not (_cuda_serving() if on_cuda is None else on_cuda):
        return "torch"
    if not HAS_TRITON:
        warn_once("no-triton", "vllm_padplugin: Triton is not importable; padded rows are masked "
                  "with torch's masked_fill_ (same results, one more launch)")
        return "torch"
    why = _probe_triton("cuda")
    if why:
        if state.strict():
            raise RuntimeError(f"vllm_padplugin: {why}")
        warn_once("triton-probe", "vllm_padplugin: %s; padded rows are masked with torch's "
                  "masked_fill_ (same results)", why)
        return "torch"
    return "triton"


def _env_on(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in _ON


def fused_topk_wanted(router: Any, impl: str) -> bool:
    """PADPLUGIN_FUSED_TOPK=1 and a router the fused kernel computes exactly as upstream:
    sigmoid scoring, no fused shared experts, Triton usable (impl == "triton")."""
    if not _env_on(FUSED_TOPK_ENV):
        return False
    if impl != "triton":
        warn_once("fused-no-triton", "vllm_padplugin: %s=1 but the Triton path is not usable here; "
                  "using upstream's grouped top-k", FUSED_TOPK_ENV)
        return False
    return (getattr(router, "scoring_func", None) == "sigmoid"
            and not getattr(router, "num_fused_shared_experts", 0)
            and isinstance(getattr(router, "num_expert_group", None), int)
            and isinstance(getattr(router, "topk_group", None), int))


def install_mask(router: Any, impl: str | None = None) -> bool:
    """Shadow ``router._compute_routing`` with a version that masks padded rows.

    ``impl`` = "triton" | "torch" (default: ``select_mask_impl()``).  Idempotent (a router
    is wrapped once).  Returns False when the router has no ``_compute_routing`` or the
    forward context API is gone (one warning).
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
    impl = impl or select_mask_impl()
    use_triton = impl == "triton"
    import torch

    from vllm_padplugin.kernels import ops  # registers padplugin:: ops

    mask_op = torch.ops.padplugin.mask_padded_routes_
    fused = fused_topk_wanted(router, impl)
    if fused:
        fused_op = torch.ops.padplugin.fused_grouped_topk
        n_groups, topk_group = router.num_expert_group, router.topk_group
        top_k = router.top_k
        renorm, scale = bool(router.renormalize), float(router.routed_scaling_factor)

    def _padding():
        """The forward context's is_padding, or None (no context / no mask)."""
        if available is not None:
            if not available():
                return None
            ctx = get_ctx()
        else:
            try:
                ctx = get_ctx()
            except (AssertionError, RuntimeError):
                return None
        return getattr(ctx, "is_padding", None)

    def _compute_routing(*args: Any, **kwargs: Any):
        if fused:
            logits = kwargs.get("router_logits", args[1] if len(args) > 1 else None)
            if (logits is not None and logits.dtype == torch.float32 and logits.dim() == 2
                    and logits.shape[-1] > n_groups and logits.shape[-1] % n_groups == 0):
                is_padding = _padding()
                if is_padding is not None:
                    try:
                        check_mask(is_padding, logits, logits)
                    except PaddingMaskError as exc:
                        if strict:
                            raise
                        warn_once("bad-mask", "vllm_padplugin: padding mask unusable (%s); routing "
                                  "this batch without masking, as upstream would", exc)
                        is_padding = None
                bias = router.e_score_correction_bias
                return fused_op(logits, bias, is_padding, top_k, n_groups, topk_group, renorm, scale)
        topk_weights, topk_ids = inner(*args, **kwargs)
        is_padding = _padding()
        if is_padding is None:
            return topk_weights, topk_ids
        try:
            check_mask(is_padding, topk_ids, topk_weights)
        except PaddingMaskError as exc:
            if strict:
                raise
            warn_once("bad-mask", "vllm_padplugin: padding mask unusable (%s); routing this "
                      "batch without masking, as upstream would", exc)
            return topk_weights, topk_ids
        mask_op(topk_weights, topk_ids, is_padding, use_triton)
        return topk_weights, topk_ids

    _compute_routing.__wrapped__ = inner  # type: ignore[attr-defined]
    router._compute_routing = _compute_routing
    setattr(router, MASKED_ATTR, True)
    setattr(router, IMPL_ATTR, impl)
    setattr(router, FUSED_ATTR, fused)
    return True


NATIVE_FAST_MASK = {"on": False}  # set by patches/native_fast_mask when it applies


def adopt_native(router: Any) -> bool:
    """Native mode (vLLM 0.31+, upstream masks): swap upstream's two out-of-place
    ``masked_fill`` for our one in-place launch, bit-identical.  Only when the
    ``native_fast_mask`` patch applied, Triton is usable and masking is on; the router's
    own ``skip_padding`` is turned off so the rows are masked once, by us."""
    if not (NATIVE_FAST_MASK["on"] and getattr(router, "skip_padding", False) is True):
        return False
    if not skip_padding_env_enabled():
        return False
    impl = select_mask_impl()
    if impl != "triton":
        return False
    if not install_mask(router, impl):
        return False
    router.skip_padding = False
    return True

