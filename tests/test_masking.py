"""Unit tests of the pure-torch masking core (no vLLM): the contract of vLLM PR #56079."""
from __future__ import annotations

import pytest
import torch

from vllm_padplugin.masking import PAD_EXPERT_ID, PaddingMaskError, check_mask, mask_padded_routes

T, K = 6, 3


def routes(t: int = T, k: int = K):
    g = torch.Generator().manual_seed(t * 31 + k)
    w = torch.rand(t, k, generator=g, dtype=torch.float32)
    ids = torch.randint(0, 64, (t, k), generator=g, dtype=torch.int32)
    return w, ids


@pytest.mark.parametrize(
    "pad",
    [
        [False, True, False, True, True, False],
        [True] * T,
        [False] * T,
        [False] * (T - 1) + [True],
    ],
    ids=["mix", "all-padding", "no-padding", "last-row"],
)
@pytest.mark.parametrize("inplace", [False, True])
def test_padded_rows_masked_others_bit_identical(pad, inplace):
    w, ids = routes()
    w0, ids0 = w.clone(), ids.clone()
    mask = torch.tensor(pad)
    ow, oids = mask_padded_routes(w, ids, mask, inplace=inplace)
    for r in range(T):
        if pad[r]:
            assert torch.all(oids[r] == PAD_EXPERT_ID) and torch.all(ow[r] == 0)
        else:  # bit-identical: compare raw bytes, not float equality
            assert torch.equal(ow[r].view(torch.int32), w0[r].view(torch.int32))
            assert torch.equal(oids[r], ids0[r])
    assert ow.dtype == w0.dtype and oids.dtype == ids0.dtype
    if inplace:
        assert ow.data_ptr() == w.data_ptr() and oids.data_ptr() == ids.data_ptr()
    else:  # out-of-place leaves the inputs alone, as upstream's masked_fill does
        assert torch.equal(w, w0) and torch.equal(ids, ids0)


def test_mask_longer_than_batch_only_first_rows_read():
    """Upstream keeps a persistent buffer and slices is_padding[:num_tokens]."""
    w, ids = routes(4)
    mask = torch.tensor([False, True, False, False, True, True, True, True])
    ow, oids = mask_padded_routes(w, ids, mask)
    assert ow.shape == (4, K)
    assert torch.equal(oids[1], torch.full((K,), PAD_EXPERT_ID, dtype=torch.int32))
    assert torch.equal(oids[[0, 2, 3]], ids[[0, 2, 3]])


def test_empty_batch():
    w, ids = routes(0)
    ow, oids = mask_padded_routes(w, ids, torch.zeros(4, dtype=torch.bool))
    assert ow.shape == (0, K) and oids.shape == (0, K)


@pytest.mark.parametrize(
    "mask,needle",
    [
        (torch.zeros(T, dtype=torch.int64), "torch.bool"),
        (torch.zeros(T - 2, dtype=torch.bool), f"shape ({T - 2},)"),
        (torch.zeros(T, 1, dtype=torch.bool), "1-D"),
        (torch.zeros(T, dtype=torch.bool, device="meta"), "meta"),
        ([False] * T, "torch.Tensor"),
    ],
    ids=["dtype", "shorter", "2-D", "device", "not-a-tensor"],
)
def test_bad_mask_one_clear_error(mask, needle):
    w, ids = routes()
    with pytest.raises(PaddingMaskError) as exc:
        mask_padded_routes(w, ids, mask)
    assert needle in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_shorter_mask_error_names_both_shapes():
    w, ids = routes()
    with pytest.raises(PaddingMaskError, match=rf"shape \(2,\).*{T} rows.*\({T}, {K}\)"):
        check_mask(torch.zeros(2, dtype=torch.bool), ids, w)


def test_mismatched_weights_and_ids():
    w, ids = routes()
    with pytest.raises(PaddingMaskError, match="topk_weights has 5 rows"):
        check_mask(torch.zeros(T, dtype=torch.bool), ids, w[:5])
