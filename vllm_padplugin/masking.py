"""Pure-torch core: keep padded rows out of expert routing.

This is the contract of vLLM PR #56079 (grouped routing with ``skip_padding``):
on rows where ``is_padding`` is true, ``topk_ids`` becomes ``-1`` (DeepEP sends
``-1`` nowhere) and ``topk_weights`` becomes ``0``; every other row is left
bit-identical.  No vLLM import here, so this module is testable alone and is
shared by the router override, the benchmarks and the GPU kernel's reference.
"""
from __future__ import annotations

import torch

PAD_EXPERT_ID = -1
PAD_WEIGHT = 0.0


class PaddingMaskError(ValueError):
    """The padding mask cannot describe this routing result."""


def check_mask(is_padding: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
    """Raise one clear error when ``is_padding`` cannot mask this batch.

    A mask longer than the batch is fine (upstream keeps a persistent buffer and
    slices ``is_padding[:num_tokens]``); shorter, non-bool, or on another device is not.
    """
    num_tokens = topk_ids.shape[0]
    if topk_weights.shape[0] != num_tokens:
        raise PaddingMaskError(
            f"topk_weights has {topk_weights.shape[0]} rows but topk_ids has {num_tokens}"
        )
    if not isinstance(is_padding, torch.Tensor):
        raise PaddingMaskError(f"is_padding must be a torch.Tensor, got {type(is_padding).__name__}")
    if is_padding.dtype != torch.bool:
        raise PaddingMaskError(f"is_padding must be torch.bool, got {is_padding.dtype}")
    if is_padding.dim() != 1:
        raise PaddingMaskError(f"is_padding must be 1-D, got shape {tuple(is_padding.shape)}")
    if is_padding.shape[0] < num_tokens:
        raise PaddingMaskError(
            f"is_padding has shape {tuple(is_padding.shape)} but the batch has {num_tokens} rows "
            f"(topk_ids shape {tuple(topk_ids.shape)}); the mask must cover every row"
        )
    if is_padding.device != topk_ids.device:
        raise PaddingMaskError(
            f"is_padding is on {is_padding.device} but topk_ids is on {topk_ids.device}"
        )


def mask_padded_routes(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    is_padding: torch.Tensor,
    *,
    inplace: bool = False,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(topk_weights, topk_ids)`` with padded rows set to ``(0, -1)``.

    ``inplace=True`` rewrites the given tensors (no allocation: CUDA-graph friendly);
    otherwise new tensors are returned, as upstream's ``masked_fill`` does.
    No host synchronisation either way.
    """
    if check:
        check_mask(is_padding, topk_ids, topk_weights)
    rows = is_padding[: topk_ids.shape[0]].unsqueeze(1)
    if inplace:
        topk_weights.masked_fill_(rows, PAD_WEIGHT)
        topk_ids.masked_fill_(rows, PAD_EXPERT_ID)
        return topk_weights, topk_ids
    return topk_weights.masked_fill(rows, PAD_WEIGHT), topk_ids.masked_fill(rows, PAD_EXPERT_ID)
