"""A persistent per-runner padding mask, filled in place before each forward.

vLLM's GPU runners pad a batch (CUDA-graph capture sizes, SP padding, DP dummy
batches).  The router must know which rows are padding.  A CUDA graph captured
once reads the mask from a fixed address, so the mask is ONE buffer allocated
once per runner and refilled in place every step: two ``fill_`` calls on views,
no host sync, no allocation, the same ``data_ptr`` in every step.  This is the
semantics of vLLM PR #56079 (0.31: ``GPUModelRunner.is_padding`` +
``_prepare_padding_mask``), kept here for the 0.28-0.30 backport.

Pure torch, no vLLM import, so it is testable alone.
"""
from __future__ import annotations

import torch


class PaddingMask:
    """``capacity`` bools on ``device``: ``prepare(u, p)`` returns rows [0, p) with [u, p) True."""

    def __init__(self, capacity: int, device: torch.device | str) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(f"padding mask capacity must be an int >= 0, got {capacity!r}")
        self.buffer = torch.zeros(capacity, dtype=torch.bool, device=device)

    @property
    def capacity(self) -> int:
        return self.buffer.shape[0]

    def fits(self, num_padded: int) -> bool:
        return 0 <= num_padded <= self.capacity

    def prepare(self, num_unpadded: int, num_padded: int) -> torch.Tensor:
        """Fill and return the view ``buffer[:num_padded]``.

        Rows ``[:num_unpadded]`` become False (real tokens), ``[num_unpadded:num_padded]``
        True (padding).  ``num_unpadded`` larger than ``num_padded`` is clamped (a batch
        with no padding), as upstream's slicing does.  Python ints only: no host sync.
        """
        if not self.fits(num_padded):
            raise ValueError(
                f"padded batch of {num_padded} tokens does not fit the padding mask "
                f"of {self.capacity} rows"
            )
        if num_unpadded < 0:
            raise ValueError(f"num_unpadded must be >= 0, got {num_unpadded}")
        view = self.buffer[:num_padded]
        view[:num_unpadded].fill_(False)
        view[num_unpadded:].fill_(True)
        return view


def micro_batch_mask(is_padding: torch.Tensor | None, token_slice: slice) -> torch.Tensor | None:
    """The rows of ``is_padding`` that belong to one DBO micro-batch (a view, no copy)."""
    if is_padding is None:
        return None
    return is_padding[token_slice]


def padded_length(num_tokens: int | None, token_slices=()) -> int | None:
    """How many rows the forward covers: ``num_tokens``, or further when micro-batch
    slices reach beyond it (a DBO dummy run passes one micro-batch's count as
    ``num_tokens`` while its slices span the whole padded batch)."""
    ends = [s.stop for s in token_slices if s.stop is not None]
    candidates = ([num_tokens] if num_tokens is not None else []) + ends
    return max(candidates) if candidates else None
