"""Fused grouped top-k routing with the padding mask, in one Triton launch.

The torch composite (:mod:`.reference`) takes ~15 launches per MoE layer (sigmoid,
bias add, two top-k's, scatter, masked_fill, gather, renormalise, scale, casts, then
upstream's two masking fills).  Here one program handles ``BLOCK_M`` tokens end to end
in registers: scores, per-group top-2 sum, group selection, top-k among eligible
experts, weights from unbiased scores, renormalise, routed scaling, and the padding
mask (one extra byte load per token).  Ties break to the lowest index; torch leaves tie
order unspecified, so tests compare ids as sets away from ties.

Falls back to the torch reference when Triton or a CUDA tensor is unavailable.
"""
from __future__ import annotations

import torch

from vllm_padplugin.kernels.reference import grouped_topk_reference
from vllm_padplugin.kernels.triton_mask import HAS_TRITON, can_use_triton, triton

if HAS_TRITON:
    import triton.language as tl

    @triton.jit
    def _grouped_topk_kernel(
        logits_ptr,
        bias_ptr,
        pad_ptr,
        w_out_ptr,
        ids_out_ptr,
        T,
        stride_t,
        scale,
        G: tl.constexpr,
        S: tl.constexpr,
        TOPK_GROUP: tl.constexpr,
        TOPK: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        HAS_PAD: tl.constexpr,
        RENORM: tl.constexpr,
        SKIP_PADDED_LOADS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        NEG: tl.constexpr = float("-inf")
        pid = tl.program_id(0)
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < T
        g = tl.arange(0, BLOCK_G)
        s = tl.arange(0, BLOCK_S)
        g3 = g[None, :, None]
        s3 = s[None, None, :]
        expert = g3 * S + s3  # [1, BG, BS] expert id
        live = row_ok
        if HAS_PAD:
            pad = tl.load(pad_ptr + rows, mask=row_ok, other=0) != 0
            if SKIP_PADDED_LOADS:  # big batches: padded rows read no logits (bandwidth-bound)
                live = row_ok & (pad == 0)
            # small batches: the pad load issues beside the logits load, adding no latency
        valid = (g3 < G) & (s3 < S) & live[:, None, None]
        rows64 = rows.to(tl.int64)[:, None, None]
        x = tl.load(logits_ptr + rows64 * stride_t + expert, mask=valid, other=0.0).to(tl.float32)
        scores = tl.sigmoid(x)
        if HAS_BIAS:
            b = tl.load(bias_ptr + expert, mask=(g3 < G) & (s3 < S), other=0.0).to(tl.float32)
            choice = tl.where(valid, scores + b, NEG)
            # group rank: sum of the two best biased scores of the group
            m1 = tl.max(choice, axis=2)
            first = tl.min(tl.where(choice == m1[:, :, None], s3, BLOCK_S), axis=2)
            m2 = tl.max(tl.where(s3 == first[:, :, None], NEG, choice), axis=2)
            rank = m1 + m2
        else:
            choice = tl.where(valid, scores, NEG)
            rank = tl.max(choice, axis=2)
        g2 = g[None, :]
        rank = tl.where(g2 < G, rank, NEG)
        keep = tl.zeros([BLOCK_M, BLOCK_G], dtype=tl.int1)
        for _ in tl.static_range(TOPK_GROUP):
            best = tl.max(rank, axis=1)
            gi = tl.min(tl.where(rank == best[:, None], g2, BLOCK_G), axis=1)
            hit = g2 == gi[:, None]
            keep = keep | hit
            rank = tl.where(hit, NEG, rank)
        choice = tl.where(keep[:, :, None], choice, NEG)

        kcol = tl.arange(0, BLOCK_K)[None, :]
        out_ids = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.int32)
        out_w = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        BIG: tl.constexpr = BLOCK_G * BLOCK_S
        for i in tl.static_range(TOPK):
            best = tl.max(tl.max(choice, axis=2), axis=1)
            sel = tl.min(tl.min(tl.where(choice == best[:, None, None], expert, BIG), axis=2), axis=1)
            hit = expert == sel[:, None, None]
            w = tl.sum(tl.sum(tl.where(hit, scores, 0.0), axis=2), axis=1)
            choice = tl.where(hit, NEG, choice)
            out_ids = tl.where(kcol == i, sel[:, None], out_ids)
            out_w = tl.where(kcol == i, w[:, None], out_w)
        if RENORM:
            out_w = out_w / tl.sum(out_w, axis=1)[:, None]
        out_w = out_w * scale
        if HAS_PAD:
            out_ids = tl.where(pad[:, None], -1, out_ids)
            out_w = tl.where(pad[:, None], 0.0, out_w)
        o = rows.to(tl.int64)[:, None] * TOPK + kcol
        st = row_ok[:, None] & (kcol < TOPK)
        tl.store(ids_out_ptr + o, out_ids, mask=st)
        tl.store(w_out_ptr + o, out_w, mask=st)


def default_config(num_tokens: int, num_experts: int) -> tuple[int, int]:
    """(BLOCK_M, num_warps): one token per one-warp program.  The H200 sweep in
    benchmarks/gpu_masking.py (BLOCK_M 1-8 x 1-4 warps, T 16..32768, 256 and 384
    experts) found this fastest at every size: the reductions stay inside one warp."""
    return 1, 1


def fused_grouped_topk(
    gating_output: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    *,
    topk: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    is_padding: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_m: int | None = None,
    num_warps: int | None = None,
    skip_padded_loads: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid grouped top-k + mask in one launch; returns ``(weights f32, ids i32)``.

    ``out`` = preallocated ``(weights, ids)`` (contiguous [T, topk]) to write into.
    ``is_padding`` may be longer than the batch; only ``[:T]`` is read.
    ``skip_padded_loads`` (default: above 1024 tokens) makes padded rows skip their logits
    load, which pays when bandwidth-bound and costs a dependent load when latency-bound.
    """
    tensors = [gating_output] + ([is_padding] if is_padding is not None else [])
    if not can_use_triton(*tensors):
        w, i = grouped_topk_reference(
            gating_output,
            e_score_correction_bias,
            topk=topk,
            num_expert_group=num_expert_group,
            topk_group=topk_group,
            renormalize=renormalize,
            routed_scaling_factor=routed_scaling_factor,
            is_padding=is_padding,
        )
        if out is not None:
            out[0].copy_(w)
            out[1].copy_(i)
            return out
        return w, i
    num_tokens, num_experts = gating_output.shape
    if num_experts % num_expert_group:
        raise ValueError(f"{num_experts} experts do not split into {num_expert_group} groups")
    if gating_output.stride(1) != 1:
        gating_output = gating_output.contiguous()
    per_group = num_experts // num_expert_group
    if out is None:
        weights = torch.empty(num_tokens, topk, dtype=torch.float32, device=gating_output.device)
        ids = torch.empty(num_tokens, topk, dtype=torch.int32, device=gating_output.device)
    else:
        weights, ids = out
    if num_tokens == 0:
        return weights, ids
    bm, nw = default_config(num_tokens, num_experts)
    bm = block_m or bm
    nw = num_warps or nw
    pad = is_padding.view(torch.uint8) if is_padding is not None else gating_output
    bias = e_score_correction_bias if e_score_correction_bias is not None else gating_output
    _grouped_topk_kernel[(triton.cdiv(num_tokens, bm),)](
        gating_output,
        bias,
        pad,
        weights,
        ids,
        num_tokens,
        gating_output.stride(0),
        float(routed_scaling_factor),
        G=num_expert_group,
        S=per_group,
        TOPK_GROUP=topk_group,
        TOPK=topk,
        HAS_BIAS=e_score_correction_bias is not None,
        HAS_PAD=is_padding is not None,
        RENORM=renormalize,
        SKIP_PADDED_LOADS=(num_tokens > 1024) if skip_padded_loads is None else skip_padded_loads,
        BLOCK_M=bm,
        BLOCK_G=triton.next_power_of_2(num_expert_group),
        BLOCK_S=triton.next_power_of_2(per_group),
        BLOCK_K=triton.next_power_of_2(topk),
        num_warps=nw,
    )
    return weights, ids
