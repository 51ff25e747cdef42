"""PATCH: on vLLM 0.31+ (native mode), mask padded rows with our one in-place launch.

Upstream's GroupedTopKRouter masks with two out-of-place ``masked_fill`` (two launches,
two new [T, k] tensors).  Measured on an H200 under CUDA-graph replay (benchmarks/
gpu_vllm_proof.py, RESULTS.md): our Triton kernel does the same in one launch.  The
result is bit-identical (padded rows (0.0, -1), every other row untouched), so the
patch only changes cost.  Applied per router at build time (router_override calls
``routing.adopt_native``): only grouped routers upstream built with ``skip_padding=True``,
only with Triton usable on CUDA; such a router gets ``skip_padding = False`` and our
mask, so rows are masked exactly once.  ``PADPLUGIN_NATIVE_FAST_MASK=0`` keeps
upstream's masking.
"""
from __future__ import annotations

import os

from vllm_padplugin.patches.base import Env, Patch

ENV = "PADPLUGIN_NATIVE_FAST_MASK"


def _needed(env: Env) -> bool:
    off = os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off")
    return env.mode == "native" and env.device_type == "cuda" and not off


def _apply(env: Env) -> list[str]:
    from vllm_padplugin import routing

    routing.NATIVE_FAST_MASK["on"] = True
    return []


PATCH = Patch(
    name="native_fast_mask",
    surface_keys=("grouped_topk_router",),
    why="Upstream masks padded rows with two out-of-place masked_fill per MoE layer; one in-place "
    "Triton launch gives bit-identical routes for less (measured, RESULTS.md 'On a real GPU').",
    how="At router build (native mode, CUDA, Triton probe passed, VLLM_MOE_SKIP_PADDING on): "
    "router.skip_padding = False and our _compute_routing wrapper masks in place (custom op "
    "padplugin::mask_padded_routes_). No upstream code is copied or edited.",
    related_pr="vLLM PR #56079 (skip_padding masking, vLLM 0.31); no upstream PR for the kernel yet",
    future_plan="Remove when upstream masks in place in one launch (or fuses the mask into "
    "grouped_topk), or if a measurement shows no gain; PADPLUGIN_NATIVE_FAST_MASK=0 turns it off.",
    needed=_needed,
    apply=_apply,
)
