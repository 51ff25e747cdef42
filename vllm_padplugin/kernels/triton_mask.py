"""One-launch, in-place padding mask for a routing result (Triton).

Upstream masks with two out-of-place ``masked_fill`` calls: two launches, two new
tensors, every row read and written.  This kernel reads only ``is_padding[:T]`` and
writes only the padded rows' ``(-1, 0)``, in one launch, with no allocation and no
host sync, so it can sit inside a captured CUDA graph.  Non-padded rows are never
touched, which makes "bit-identical elsewhere" hold by construction.

Without Triton (or for CPU tensors) :func:`mask_padded_routes_inplace` falls back to
:func:`vllm_padplugin.masking.mask_padded_routes` with ``inplace=True``.
"""
from __future__ import annotations

import os

import torch

from vllm_padplugin.masking import check_mask, mask_padded_routes

try:  # Triton is optional (CPU builds, HPU): never let its absence break an import.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except Exception:  # ImportError, or a broken install raising something else
    triton = None
    tl = None
    HAS_TRITON = False


def _interpreting() -> bool:
    """Triton's CPU interpreter (TRITON_INTERPRET=1) runs the kernel on CPU tensors: used by tests."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if HAS_TRITON:

    @triton.jit
    def _mask_rows_kernel(
        w_ptr,
        ids_ptr,
        pad_ptr,
        pad_stride,
        T,
        K,
        w_stride_t,
        w_stride_k,
        ids_stride_t,
        ids_stride_k,
        BLOCK_T: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid = tl.program_id(0)
        rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        in_rows = rows < T
        # bool mask passed as uint8 view; only [:T] is read even if the buffer is longer.
        pad = tl.load(pad_ptr + rows.to(tl.int64) * pad_stride, mask=in_rows, other=0) != 0
        cols = tl.arange(0, BLOCK_K)
        write = (pad & in_rows)[:, None] & (cols < K)[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        cols64 = cols.to(tl.int64)[None, :]
        tl.store(
            ids_ptr + rows64 * ids_stride_t + cols64 * ids_stride_k,
            tl.full([BLOCK_T, BLOCK_K], -1, ids_ptr.dtype.element_ty),
            mask=write,
        )
        tl.store(
            w_ptr + rows64 * w_stride_t + cols64 * w_stride_k,
            tl.zeros([BLOCK_T, BLOCK_K], w_ptr.dtype.element_ty),
            mask=write,
        )


def _block_t(num_tokens: int, block_k: int) -> int:
    # ~2k elements per program: few programs for tiny batches, enough for the big ones.
    bt = max(16, 2048 // block_k)
    return min(bt, max(16, triton.next_power_of_2(max(num_tokens, 1))))


def can_use_triton(*tensors: torch.Tensor) -> bool:
    """True when the Triton kernel can run on these tensors (CUDA, or the CPU interpreter)."""
    if not HAS_TRITON:
        return False
    return all(t.is_cuda for t in tensors) or _interpreting()


def mask_padded_routes_inplace(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    is_padding: torch.Tensor,
    *,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Set padded rows to ``(0, -1)`` in place, in one launch; return the same tensors.

    ``is_padding`` may be longer than the batch (only ``[:T]`` is read).  Falls back to
    the torch core when Triton or CUDA is unavailable.  No host sync, no allocation.
    """
    if check:
        check_mask(is_padding, topk_ids, topk_weights)
    if not can_use_triton(topk_weights, topk_ids, is_padding):
        return mask_padded_routes(topk_weights, topk_ids, is_padding, inplace=True, check=False)
    num_tokens = topk_ids.shape[0]
    if num_tokens == 0:
        return topk_weights, topk_ids
    k = topk_ids.shape[1]
    block_k = triton.next_power_of_2(k)
    block_t = _block_t(num_tokens, block_k)
    grid = (triton.cdiv(num_tokens, block_t),)
    _mask_rows_kernel[grid](
        topk_weights,
        topk_ids,
        is_padding.view(torch.uint8),
        is_padding.stride(0),
        num_tokens,
        k,
        topk_weights.stride(0),
        topk_weights.stride(1),
        topk_ids.stride(0),
        topk_ids.stride(1),
        BLOCK_T=block_t,
        BLOCK_K=block_k,
        num_warps=4,
    )
    return topk_weights, topk_ids
