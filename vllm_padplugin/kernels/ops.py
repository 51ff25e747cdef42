"""Our kernels as ``torch.library`` custom ops, so vLLM's compiled graphs can hold them.

Why custom ops: vLLM runs the model (routers included) under ``torch.compile`` with a
dynamic token dimension.  Dynamo can trace a raw ``@triton.jit`` launch, but our
launchers compute block sizes from the token count in Python (``next_power_of_2``,
``min``/``max``), which on a symbolic size means guards and recompiles per batch
size.  An opaque custom op with a declared mutation (the mask) or a fake impl giving
output shapes (fused top-k) traces once, keeps its single launch at run time, and is
captured by CUDA graphs like any other op (no allocation inside the mask op, no
host sync in either).

- ``padplugin::mask_padded_routes_(Tensor(a!) w, Tensor(b!) ids, Tensor pad) -> ()``
- ``padplugin::fused_grouped_topk(logits, bias?, pad?, ...) -> (w f32, ids i32)``

Each impl runs the Triton kernel on CUDA tensors when ``use_triton`` is true and the
torch composite otherwise (same results; the selection lives in ``routing``).
"""
from __future__ import annotations

import torch

from vllm_padplugin.masking import mask_padded_routes
from vllm_padplugin.kernels import triton_mask

LIB = "padplugin"


@torch.library.custom_op(f"{LIB}::mask_padded_routes_", mutates_args=("topk_weights", "topk_ids"))
def mask_padded_routes_(topk_weights: torch.Tensor, topk_ids: torch.Tensor, is_padding: torch.Tensor,
                        use_triton: bool) -> None:
    """Padded rows -> (0, -1) in place: one Triton launch on CUDA, else torch's two fills."""
    if use_triton and triton_mask.can_use_triton(topk_weights, topk_ids, is_padding):
        triton_mask.mask_padded_routes_inplace(topk_weights, topk_ids, is_padding, check=False)
    else:
        mask_padded_routes(topk_weights, topk_ids, is_padding, inplace=True, check=False)


@mask_padded_routes_.register_fake
def _(topk_weights, topk_ids, is_padding, use_triton) -> None:
    return None


@torch.library.custom_op(f"{LIB}::fused_grouped_topk", mutates_args=())
def fused_grouped_topk_op(gating_output: torch.Tensor, e_score_correction_bias: torch.Tensor | None,
                          is_padding: torch.Tensor | None, topk: int, num_expert_group: int,
                          topk_group: int, renormalize: bool, routed_scaling_factor: float,
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """h11kernel's ``fused_grouped_topk`` (sigmoid, mask folded in), used as it is."""
    from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk

    w, ids = fused_grouped_topk(gating_output, e_score_correction_bias, topk=topk,
                                num_expert_group=num_expert_group, topk_group=topk_group,
                                renormalize=renormalize, routed_scaling_factor=routed_scaling_factor,
                                is_padding=is_padding)
    return w, ids


@fused_grouped_topk_op.register_fake
def _(gating_output, e_score_correction_bias, is_padding, topk, num_expert_group, topk_group,
      renormalize, routed_scaling_factor):
    t = gating_output.shape[0]
    return (gating_output.new_empty((t, topk), dtype=torch.float32),
            gating_output.new_empty((t, topk), dtype=torch.int32))
