"""Optional GPU kernels (Triton) for the padding mask and fused grouped top-k.

Triton is optional: importing this package never fails without it; the entry points
fall back to the pure-torch core (:mod:`vllm_padplugin.masking`, :mod:`.reference`).
"""
from vllm_padplugin.kernels.triton_mask import HAS_TRITON, mask_padded_routes_inplace

__all__ = ["HAS_TRITON", "mask_padded_routes_inplace"]
