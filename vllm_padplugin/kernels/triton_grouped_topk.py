"""Fused grouped top-k routing with the padding mask, in one Triton launch.

The torch composite (:mod:`.reference`) takes ~15 launches per MoE layer.  Here one
program routes ``BLOCK_M`` tokens end to end in registers, on a flat [BLOCK_M, groups x
experts-per-group] tile read once with 16-byte loads (the layout Triton gives it needs no
shuffles or shared memory between stages: a reshaped [M, G, S] or quad-sorted tile cost
~1.5x the instructions in the H200 sweep, see benchmarks/RESULTS.md):

1. scores = sigmoid(logits); choice = scores + correction bias.
2. A group's rank = the sum of its two best choices (one tuple reduction), the
   ``topk_group`` best groups stay eligible (ties: lowest group id).
3. ``topk`` value-only passes (row max, then drop every element equal to it) give the
   k-th best eligible value ``thr``: one reduction per pass instead of the two (value,
   then lowest id) a max-and-mask pass needs.
4. The selected set is ``choice >= thr``.  When exactly ``topk`` experts pass, that set
   IS the top-k.  Only when a tie among the best values of some row of the tile makes
   more pass does the tile take the exact path: ``topk`` max + lowest-id passes, so ties
   go to the lowest expert id (the reference's definition).
5. Weights from the unbiased scores, renormalised and scaled; each selected expert is
   written by the thread that holds it at its rank among the row's selected ids (prefix
   sum), so ids come out in ascending expert order.  The set and the weight per id are
   the reference's; the order within a row is not (vLLM asks torch.topk for
   ``sorted=False``, whose order is unspecified).
6. Padded rows (``is_padding``) get ``(-1, 0)``; with ``skip_padded_loads`` they read no
   logits at all.

At large batches the kernel is bound by instructions, not by memory: ~1.2k SASS
instructions per token for DeepSeek-V3 (benchmarks/RESULTS.md has the figures).

Falls back to the torch reference when Triton or a CUDA tensor is unavailable.
"""
from __future__ import annotations

import torch

from vllm_padplugin.kernels.reference import grouped_topk_reference
from vllm_padplugin.kernels.triton_mask import HAS_TRITON, can_use_triton, triton

if HAS_TRITON:
    import triton.language as tl

    @triton.jit
    def _top2(a1, a2, b1, b2):
        """Combine two (best, second best) pairs; duplicates count twice, like topk(2)."""
        return tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2))

    @triton.jit
    def _grouped_topk_kernel(
        logits_ptr,
        bias_ptr,
        pad_ptr,
        w_out_ptr,
        ids_out_ptr,
        T,
        stride_t,
        pad_stride,
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
        BIG: tl.constexpr = G * S
        pid = tl.program_id(0)
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < T
        live = row_ok
        if HAS_PAD:
            pad = tl.load(pad_ptr + rows.to(tl.int64) * pad_stride, mask=row_ok, other=0) != 0
            if SKIP_PADDED_LOADS:  # big batches: padded rows read no logits (bandwidth-bound)
                live = row_ok & (pad == 0)
        EP: tl.constexpr = BLOCK_G * BLOCK_S
        f = tl.arange(0, EP)[None, :]  # flat tile index; expert = group * S + slot
        grp = f // BLOCK_S
        expert = grp * S + f % BLOCK_S
        e_ok = (grp < G) & (f % BLOCK_S < S)
        valid = e_ok & live[:, None]
        rows64 = rows.to(tl.int64)[:, None]
        x = tl.load(logits_ptr + rows64 * stride_t + expert, mask=valid, other=0.0).to(tl.float32)
        scores = tl.sigmoid(x)
        if HAS_BIAS:
            choice = scores + tl.load(bias_ptr + expert, mask=e_ok, other=0.0).to(tl.float32)
        else:
            choice = scores
        choice = tl.where(valid, choice, NEG)

        eligible = choice
        if G > 1:
            c3 = tl.reshape(choice, [BLOCK_M, BLOCK_G, BLOCK_S])
            if HAS_BIAS:  # a group's rank = the sum of its two best biased scores
                a1, a2 = tl.reduce((c3, tl.full(c3.shape, NEG, tl.float32)), 2, _top2)
                rank = a1 + a2
            else:
                rank = tl.max(c3, axis=2)
            g2 = tl.arange(0, BLOCK_G)[None, :]
            rank = tl.where(g2 < G, rank, NEG)
            keep = tl.zeros([BLOCK_M, EP], dtype=tl.int1)
            for _ in tl.static_range(TOPK_GROUP):
                best = tl.max(rank, axis=1)
                gi = tl.min(tl.where(rank == best[:, None], g2, BLOCK_G), axis=1)
                rank = tl.where(g2 == gi[:, None], NEG, rank)
                keep = keep | (grp == gi[:, None])
            eligible = tl.where(keep, choice, NEG)

        # k value-only passes: thr = the k-th distinct best eligible choice
        v = eligible
        thr = tl.full([BLOCK_M], NEG, tl.float32)
        for _ in tl.static_range(TOPK):
            thr = tl.max(v, axis=1)
            v = tl.where(v == thr[:, None], NEG, v)
        sel = eligible >= thr[:, None]
        count = tl.sum(sel.to(tl.int32), axis=1)
        count = tl.where(live, count, TOPK)
        if tl.max(count, axis=0) > TOPK:
            # a tie among the k best values in some row: exact passes, lowest id first
            v = eligible
            sel = tl.zeros([BLOCK_M, EP], dtype=tl.int1)
            for _ in tl.static_range(TOPK):
                m = tl.max(v, axis=1)
                pick = tl.min(tl.where(v == m[:, None], f, EP), axis=1)
                took = f == pick[:, None]
                sel = sel | took
                v = tl.where(took, NEG, v)

        w = tl.where(sel, scores, 0.0)
        if RENORM:
            w = w * (scale / tl.sum(w, axis=1))[:, None]
        else:
            w = w * scale
        # rank of each selected expert among the row's selected ones, in expert order
        pos = tl.cumsum(sel.to(tl.int32), axis=1) - 1
        st = sel & (pos < TOPK) & row_ok[:, None]
        if HAS_PAD:
            st = st & (pad == 0)[:, None]
        o = rows.to(tl.int64)[:, None] * TOPK + pos
        tl.store(ids_out_ptr + o, expert + tl.zeros_like(pos), mask=st)
        tl.store(w_out_ptr + o, w, mask=st)
        if HAS_PAD:
            kcol = tl.arange(0, BLOCK_K)[None, :]
            pm = (pad & row_ok)[:, None] & (kcol < TOPK)
            op = rows.to(tl.int64)[:, None] * TOPK + kcol
            tl.store(ids_out_ptr + op, tl.full([BLOCK_M, BLOCK_K], -1, tl.int32), mask=pm)
            tl.store(w_out_ptr + op, tl.zeros([BLOCK_M, BLOCK_K], tl.float32), mask=pm)


# (BLOCK_M, num_warps) per batch size, from the H200 sweep in benchmarks/gpu_masking.py
# (--tune; benchmarks/RESULTS.md): one token per one-warp program won at every size, for
# both routers; key = the smallest batch size an entry is for.
_CONFIGS: dict[int, tuple[int, int]] = {0: (1, 1)}


def default_config(num_tokens: int, num_experts: int, dtype: torch.dtype | None = None) -> tuple[int, int]:
    """(BLOCK_M, num_warps) for a batch: the entry of ``_CONFIGS`` for the largest key <= T."""
    key = max(k for k in _CONFIGS if k <= max(num_tokens, 0))
    return _CONFIGS[key]


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

    ``gating_output``: [T, E] float32 / bfloat16 / float16 logits.
    ``out`` = preallocated ``(weights, ids)`` (contiguous [T, topk]) to write into.
    ``is_padding`` may be longer than the batch; only ``[:T]`` is read.
    ``skip_padded_loads`` (default: above 1024 tokens) makes padded rows skip their logits
    load, which pays when bandwidth-bound and costs a dependent load when latency-bound.
    Ids within a row come in ascending expert order (the set is the reference's).
    """
    tensors = [gating_output] + ([is_padding] if is_padding is not None else [])
    num_tokens, num_experts = gating_output.shape
    per_group = num_experts // max(num_expert_group, 1)
    if not can_use_triton(*tensors) or per_group < 2 or topk > topk_group * per_group:
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
    if num_experts % num_expert_group:
        raise ValueError(f"{num_experts} experts do not split into {num_expert_group} groups")
    if gating_output.stride(1) != 1:
        gating_output = gating_output.contiguous()
    if out is None:
        weights = torch.empty(num_tokens, topk, dtype=torch.float32, device=gating_output.device)
        ids = torch.empty(num_tokens, topk, dtype=torch.int32, device=gating_output.device)
    else:
        weights, ids = out
    if num_tokens == 0:
        return weights, ids
    bm, nw = default_config(num_tokens, num_experts, gating_output.dtype)
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
        is_padding.stride(0) if is_padding is not None else 0,
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
        BLOCK_S=max(4, triton.next_power_of_2(per_group)),
        BLOCK_K=triton.next_power_of_2(topk),
        num_warps=nw,
    )
    return weights, ids
