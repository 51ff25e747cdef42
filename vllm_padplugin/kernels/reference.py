"""Pure-torch grouped top-k routing: the reference the fused Triton kernel is checked against.

Same semantics as vLLM's unfused ``grouped_topk`` (DeepSeek-V2/V3 routing), written
independently: score = sigmoid (or softmax) of the router logits; when an
``e_score_correction_bias`` is given, experts are *chosen* on biased scores and a group
is ranked by the sum of its two best biased scores (else by its best score); only the
``topk_group`` best groups stay eligible; the top-``topk`` eligible experts are picked
and *weighted* by their unbiased scores, optionally renormalised to sum 1, then
multiplied by ``routed_scaling_factor``.  Output: float32 weights, int32 ids, like
upstream.  Arithmetic is float32 (the fused CUDA kernel upstream uses on GPU upcasts too).

``is_padding`` (optional) applies the plugin's mask on top, out of place, the way
upstream's router does after routing.  Also used as the "torch composite" baseline in
``benchmarks/gpu_masking.py``; everything here is CUDA-graph capturable (no host sync).
"""
from __future__ import annotations

import torch

from vllm_padplugin.masking import mask_padded_routes


def _top_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest per row; equal values: lowest index first."""
    return x.sort(dim=-1, descending=True, stable=True).indices[:, :k]


def grouped_topk_reference(
    gating_output: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    *,
    topk: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    scoring_func: str = "sigmoid",
    is_padding: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(topk_weights float32 [T, topk], topk_ids int32 [T, topk])``."""
    num_tokens, num_experts = gating_output.shape
    if num_experts % num_expert_group:
        raise ValueError(f"{num_experts} experts do not split into {num_expert_group} groups")
    per_group = num_experts // num_expert_group
    logits = gating_output.float()
    if scoring_func == "sigmoid":
        scores = logits.sigmoid()
    elif scoring_func == "softmax":
        scores = logits.softmax(dim=-1)
    else:
        raise ValueError(f"unknown scoring_func {scoring_func!r}")

    if e_score_correction_bias is not None:
        choice = scores + e_score_correction_bias.float().unsqueeze(0)
        # a group's rank = sum of its two best biased scores (DeepSeek-V3's noaux_tc)
        group_rank = choice.view(num_tokens, num_expert_group, per_group).topk(2, dim=-1).values.sum(-1)
    else:
        choice = scores
        group_rank = choice.view(num_tokens, num_expert_group, per_group).amax(dim=-1)

    best_groups = _top_indices(group_rank, topk_group)
    group_ok = torch.zeros_like(group_rank, dtype=torch.bool).scatter_(1, best_groups, True)
    expert_ok = group_ok.unsqueeze(-1).expand(num_tokens, num_expert_group, per_group).reshape(
        num_tokens, num_experts
    )
    eligible = choice.masked_fill(~expert_ok, float("-inf"))
    topk_ids = _top_indices(eligible, topk)
    topk_weights = scores.gather(1, topk_ids)  # unbiased scores weight the chosen experts
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        topk_weights = topk_weights * routed_scaling_factor
    topk_weights = topk_weights.to(torch.float32)
    topk_ids = topk_ids.to(torch.int32)
    if is_padding is not None:
        topk_weights, topk_ids = mask_padded_routes(topk_weights, topk_ids, is_padding, check=False)
    return topk_weights, topk_ids


def decision_margin(choice, ri, num_expert_group: int, topk_group: int, topk: int) -> torch.Tensor:
    """Per row: the smaller of the reference's two decision margins (torch fp32 values):
    4th vs 5th group rank and k-th vs (k+1)-th eligible choice.  A row whose margin is
    below rounding may go either way in another (correctly rounded) implementation."""
    T, E = choice.shape
    G = num_expert_group
    rank = choice.view(T, G, E // G).topk(2, dim=-1).values.sum(-1) if E // G >= 2 else choice.view(T, G, 1)[..., 0]
    r = rank.sort(1, descending=True).values
    gm = (r[:, topk_group - 1] - r[:, topk_group]) if topk_group < G else torch.full((T,), float("inf"), device=choice.device)
    grp = ri.long().clamp(min=0) // (E // G)
    keep = torch.zeros(T, G, dtype=torch.bool, device=choice.device).scatter_(1, grp, True)
    el = choice.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf")).sort(1, descending=True).values
    em = el[:, topk - 1] - el[:, topk]
    return torch.minimum(gm, em.nan_to_num(float("inf")))
