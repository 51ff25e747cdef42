"""Router and DeepEP-dispatch models for the balance benchmark (pure torch, no vLLM).

Why a re-implementation instead of vLLM's ``grouped_topk``: the benchmark must run
without vLLM (and without its ``torch.compile`` wrapper), and it models what the GPU
does.  The semantics follow vLLM's grouped top-k for DeepSeek-V3-style routers:
scores (sigmoid or softmax) + optional ``e_score_correction_bias`` for *selection*,
group score = sum of the top-2 biased scores in the group (max score without bias),
keep the ``topk_groups`` best groups, top-k experts inside them, weights from the
*unbiased* scores, optional renormalisation, then the routed scaling factor.

Ties go to the lowest expert id, as CUDA's ``torch.topk`` and the fused routing
kernels resolve them.  (CPU ``torch.topk`` does not: on all-equal rows of 256 it
returns ids 168..175.)  So identical logits -- e.g. zero hidden states through a
bias-free gate -- send every such row to the same experts, which is the straggler
PR #56079 showed.

The dispatch model is DeepEP's: experts are split contiguously over the EP ranks and
a token is sent once to every rank that owns at least one of its expert ids; id ``-1``
is sent nowhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RouterSpec:
    """Shape and scoring of one MoE router."""

    name: str
    num_experts: int
    num_groups: int
    topk_groups: int
    top_k: int
    scoring: str = "sigmoid"  # "sigmoid" | "softmax"
    correction_bias: bool = True  # e_score_correction_bias present
    renormalize: bool = True
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.num_experts % self.num_groups:
            raise ValueError(f"{self.name}: {self.num_experts} experts do not split into {self.num_groups} groups")
        if not 1 <= self.topk_groups <= self.num_groups:
            raise ValueError(f"{self.name}: topk_groups={self.topk_groups} not in 1..{self.num_groups}")
        if self.top_k > self.topk_groups * (self.num_experts // self.num_groups):
            raise ValueError(f"{self.name}: top_k={self.top_k} exceeds the experts of the chosen groups")
        if self.scoring not in ("sigmoid", "softmax"):
            raise ValueError(f"{self.name}: unknown scoring {self.scoring!r}")


# DeepSeek-V3 config.json: n_routed_experts 256, n_group 8, topk_group 4, num_experts_per_tok 8,
# scoring_func sigmoid, topk_method noaux_tc (correction bias), norm_topk_prob, routed_scaling_factor 2.5.
DEEPSEEK_V3 = RouterSpec("deepseek-v3", 256, 8, 4, 8, "sigmoid", True, True, 2.5)
# Kimi-style: 384 experts in one group, top-8, sigmoid, scaling 2.827 (Kimi K2), modelled WITHOUT a
# trained correction bias, so identical logits tie and resolve to the lowest ids (rank 0).
KIMI_STYLE = RouterSpec("kimi-style", 384, 1, 1, 8, "sigmoid", False, True, 2.827)
ROUTERS = {r.name: r for r in (DEEPSEEK_V3, KIMI_STYLE)}


def topk_lowest_id_ties(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim, ties broken towards the lowest index (deterministic).

    Rows whose k+1 largest values are all distinct have one answer, which ``torch.topk``
    gives quickly.  Rows with a tie among them take a stable descending sort, which keeps
    equal values in index order, so the first k are the lowest ids among equals.
    """
    n = values.shape[-1]
    if k + 1 > n:
        vals, idx = torch.sort(values, dim=-1, descending=True, stable=True)
        return vals[..., :k], idx[..., :k]
    vals, idx = torch.topk(values, k + 1, dim=-1, sorted=True)
    tie = (vals[..., 1:] == vals[..., :-1]).any(dim=-1)
    vals, idx = vals[..., :k].clone(), idx[..., :k].clone()
    if tie.any():
        tie_vals, tie_idx = torch.sort(values[tie], dim=-1, descending=True, stable=True)
        vals[tie], idx[tie] = tie_vals[..., :k], tie_idx[..., :k]
    return vals, idx


def grouped_topk(
    logits: torch.Tensor,
    spec: RouterSpec,
    correction_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route ``logits`` [T, E]; return ``(topk_weights float32 [T, k], topk_ids int32 [T, k])``."""
    num_tokens, num_experts = logits.shape
    if num_experts != spec.num_experts:
        raise ValueError(f"{spec.name}: logits have {num_experts} experts, expected {spec.num_experts}")
    if spec.correction_bias and correction_bias is None:
        raise ValueError(f"{spec.name}: needs an e_score_correction_bias of shape ({num_experts},)")
    logits = logits.float()
    scores = logits.sigmoid() if spec.scoring == "sigmoid" else logits.softmax(dim=-1)

    per_group = num_experts // spec.num_groups
    if spec.correction_bias:
        choice = scores + correction_bias.float().unsqueeze(0)
        group_scores = topk_lowest_id_ties(choice.view(num_tokens, spec.num_groups, per_group), 2)[0].sum(-1)
    else:
        choice = scores
        group_scores = choice.view(num_tokens, spec.num_groups, per_group).amax(dim=-1)

    group_ids = topk_lowest_id_ties(group_scores, spec.topk_groups)[1]
    keep_group = torch.zeros(num_tokens, spec.num_groups, dtype=torch.bool)
    keep_group.scatter_(1, group_ids, True)
    keep_expert = keep_group.repeat_interleave(per_group, dim=1)
    choice = choice.masked_fill(~keep_expert, float("-inf"))

    topk_ids = topk_lowest_id_ties(choice, spec.top_k)[1]
    topk_weights = scores.gather(1, topk_ids)  # unbiased scores weight the experts
    if spec.renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    if spec.routed_scaling_factor != 1.0:
        topk_weights = topk_weights * spec.routed_scaling_factor
    return topk_weights.float(), topk_ids.to(torch.int32)


def expert_owner(topk_ids: torch.Tensor, num_experts: int, ep_size: int) -> torch.Tensor:
    """EP rank owning each expert id (contiguous split); ``-1`` ids stay ``-1``."""
    if num_experts % ep_size:
        raise ValueError(f"{num_experts} experts do not split evenly over {ep_size} EP ranks")
    owner = torch.div(topk_ids.long(), num_experts // ep_size, rounding_mode="floor")
    return torch.where(topk_ids >= 0, owner, torch.full_like(owner, -1))


def dispatch_targets(topk_ids: torch.Tensor, num_experts: int, ep_size: int) -> torch.Tensor:
    """Bool [T, ep_size]: does DeepEP send token t to rank r (once, however many of its experts live there)."""
    owner = expert_owner(topk_ids, num_experts, ep_size)
    sent = torch.zeros(topk_ids.shape[0], ep_size + 1, dtype=torch.bool)
    sent.scatter_(1, torch.where(owner >= 0, owner, ep_size), True)  # column ep_size collects -1 ("nowhere")
    return sent[:, :ep_size]


def tokens_per_rank(topk_ids: torch.Tensor, num_experts: int, ep_size: int) -> torch.Tensor:
    """int64 [ep_size]: tokens each EP rank receives in one dispatch."""
    return dispatch_targets(topk_ids, num_experts, ep_size).sum(dim=0)


def straggler_factor(loads: torch.Tensor) -> float:
    """max rank load / mean rank load (1.0 = perfect balance; 0 tokens anywhere -> 1.0)."""
    loads = loads.double()
    mean = loads.mean().item()
    return 1.0 if mean == 0 else loads.max().item() / mean
