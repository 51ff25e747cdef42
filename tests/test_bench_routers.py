"""The balance benchmark's router and DeepEP-dispatch models (pure torch).

The dispatch model stands in for DeepEP, which cannot run here: its rule (a token goes once to
each rank owning one of its expert ids, ``-1`` goes nowhere) is checked on hand-made ids.
The router model is checked against vLLM's own ``grouped_topk`` where vLLM is installed.
"""
from __future__ import annotations

import pytest
import torch

from vllm_padplugin.bench.routers import (
    DEEPSEEK_V3,
    KIMI_STYLE,
    RouterSpec,
    dispatch_targets,
    expert_owner,
    grouped_topk,
    straggler_factor,
    tokens_per_rank,
    topk_lowest_id_ties,
)


def test_ties_go_to_lowest_ids():
    _, ids = topk_lowest_id_ties(torch.zeros(3, 256), 8)
    assert ids.tolist() == [list(range(8))] * 3
    row = torch.tensor([[1.0, 5.0, 3.0, 5.0, 5.0, 0.0]])
    vals, ids = topk_lowest_id_ties(row, 2)
    assert ids.tolist() == [[1, 3]] and vals.tolist() == [[5.0, 5.0]]


def test_topk_matches_stable_sort_with_and_without_ties():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 256, generator=gen)
    x[::3, 40] = x[::3, 7] = x[::3].max(dim=1).values + 1  # ties at the top
    x[1::3, 100:110] = 0.25  # ties somewhere in the middle
    want_vals, want_ids = torch.sort(x, dim=-1, descending=True, stable=True)
    vals, ids = topk_lowest_id_ties(x, 8)
    assert torch.equal(ids, want_ids[:, :8]) and torch.equal(vals, want_vals[:, :8])


@pytest.mark.parametrize("spec", [DEEPSEEK_V3, KIMI_STYLE], ids=lambda s: s.name)
def test_identical_logits_pick_identical_experts(spec):
    bias = torch.linspace(-0.01, 0.01, spec.num_experts) if spec.correction_bias else None
    _, ids = grouped_topk(torch.zeros(64, spec.num_experts), spec, bias)
    assert (ids == ids[0]).all()
    if not spec.correction_bias:  # all scores tie: lowest ids, i.e. all on EP rank 0
        assert sorted(ids[0].tolist()) == list(range(spec.top_k))


def test_excluded_groups_never_selected():
    """The single best expert lives in the group with the worst top-2 sum: it must not be chosen."""
    spec = RouterSpec("t", num_experts=16, num_groups=4, topk_groups=2, top_k=4, correction_bias=True)
    logits = torch.full((1, 16), -4.0)
    logits[0, 12] = 8.0  # group 3: one excellent expert, the rest poor
    logits[0, 0:2] = 3.0  # group 0: two good experts
    logits[0, 4:6] = 2.5  # group 1: two good experts
    _, ids = grouped_topk(logits, spec, torch.zeros(16))
    assert 12 not in ids[0].tolist()
    assert set(ids[0].tolist()) <= set(range(0, 8))


def test_grouped_selection_stays_inside_top_groups():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(500, 256, generator=gen)
    bias = torch.randn(256, generator=gen) * 0.01
    _, ids = grouped_topk(logits, DEEPSEEK_V3, bias)
    biased = logits.sigmoid() + bias
    group_scores = biased.view(500, 8, 32).topk(2, dim=-1).values.sum(-1)
    top_groups = group_scores.topk(4, dim=-1).indices
    chosen_groups = ids.long() // 32
    for row in range(500):
        assert set(chosen_groups[row].tolist()) <= set(top_groups[row].tolist())


def test_weights_use_unbiased_scores_renormalised_and_scaled():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(20, 256, generator=gen)
    bias = torch.randn(256, generator=gen) * 0.01
    weights, ids = grouped_topk(logits, DEEPSEEK_V3, bias)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    raw = logits.sigmoid().gather(1, ids.long())
    expected = raw / raw.sum(dim=-1, keepdim=True) * DEEPSEEK_V3.routed_scaling_factor
    torch.testing.assert_close(weights, expected)


def test_dispatch_counts_a_token_once_per_rank():
    ids = torch.tensor(
        [
            [0, 1, 2, 3, 4, 5, 6, 7],  # all on rank 0 (32 experts per rank): one send
            [0, 31, 32, 63, 64, 95, 96, 255],  # ranks 0,1,2,3 and 7
            [-1] * 8,  # masked padding row: nowhere
            [-1, -1, 200, -1, 201, -1, -1, -1],  # only rank 6
        ],
        dtype=torch.int32,
    )
    targets = dispatch_targets(ids, 256, 8)
    assert targets.sum(dim=1).tolist() == [1, 5, 0, 1]
    assert tokens_per_rank(ids, 256, 8).tolist() == [2, 1, 1, 1, 0, 0, 1, 1]
    assert expert_owner(ids, 256, 8)[2].tolist() == [-1] * 8


def test_uneven_expert_split_is_an_error():
    with pytest.raises(ValueError, match="do not split evenly"):
        expert_owner(torch.zeros(1, 8, dtype=torch.int32), 384, 7)


def test_straggler_factor():
    assert straggler_factor(torch.tensor([5, 5, 5, 5])) == 1.0
    assert straggler_factor(torch.tensor([4, 0, 0, 0])) == 4.0
    assert straggler_factor(torch.zeros(8, dtype=torch.long)) == 1.0


def _vllm_grouped_topk():
    vllm = pytest.importorskip("vllm")
    for path in (
        "vllm.model_executor.layers.fused_moe.router.grouped_topk_router",
        "vllm.model_executor.layers.fused_moe.fused_moe",
    ):
        try:
            module = __import__(path, fromlist=["grouped_topk"])
            fn = module.grouped_topk
            break
        except (ImportError, AttributeError):
            continue
    else:
        pytest.fail(f"vLLM {vllm.__version__}: grouped_topk not found")
    # The torch.compile wrapper would compile on CPU (slow); the semantics live in the original function.
    return getattr(fn, "_torchdynamo_orig_callable", fn)


@pytest.mark.vllm
@pytest.mark.parametrize("spec", [DEEPSEEK_V3, KIMI_STYLE], ids=lambda s: s.name)
def test_matches_vllm_grouped_topk(spec):
    """Same expert sets and weights as the installed vLLM's grouped_topk on random (tie-free) logits."""
    upstream = _vllm_grouped_topk()
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(300, spec.num_experts, generator=gen)
    bias = torch.randn(spec.num_experts, generator=gen) * 0.01 if spec.correction_bias else None
    want_w, want_ids = upstream(
        logits, logits, spec.top_k, spec.renormalize, spec.num_groups, spec.topk_groups,
        spec.scoring, spec.routed_scaling_factor, bias,
    )
    got_w, got_ids = grouped_topk(logits, spec, bias)
    # upstream may return the k experts unsorted: compare per row after sorting by id
    want_order, got_order = want_ids.long().argsort(dim=1), got_ids.long().argsort(dim=1)
    assert torch.equal(want_ids.long().gather(1, want_order), got_ids.long().gather(1, got_order))
    torch.testing.assert_close(want_w.gather(1, want_order), got_w.gather(1, got_order))
