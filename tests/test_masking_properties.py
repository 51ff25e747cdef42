"""Property tests of the masking core (hypothesis; ~1100 generated cases, a few seconds).

For any routing result and mask: non-padded rows stay bit-identical (NaN, inf and -0.0
included), padded rows become exactly (-1, 0), the function is idempotent, dtypes,
shapes and devices are preserved, in-place and out-of-place agree, and a mask longer
than the batch only has its first T entries read.  The same properties are checked for
``kernels.mask_padded_routes_inplace``: on CPU it falls back to the torch core, on a
CUDA machine the cases also run on the GPU through the Triton kernel, which must agree
with the torch reference bit for bit.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_padplugin.kernels import mask_padded_routes_inplace
from vllm_padplugin.masking import PAD_EXPERT_ID, mask_padded_routes

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ID_DTYPES = [torch.int32, torch.int64]
W_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SPECIAL = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-30])


@st.composite
def routing(draw):
    """(weights, ids, is_padding) on a random device; mask possibly longer than the batch."""
    T = draw(st.integers(0, 48))
    k = draw(st.integers(1, 16))
    extra = draw(st.integers(0, 9))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(T, k, generator=g)
    if draw(st.booleans()) and T:  # sprinkle values whose bits a careless kernel would change
        pos = torch.randint(0, T * k, (max(1, T * k // 4),), generator=g)
        w.view(-1)[pos] = SPECIAL[torch.randint(0, len(SPECIAL), pos.shape, generator=g)]
    ids = torch.randint(-1, 384, (T, k), generator=g)
    p = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    mask = torch.rand(T + extra, generator=g) < p
    dev = draw(st.sampled_from(DEVICES))
    return (
        w.to(draw(st.sampled_from(W_DTYPES))).to(dev),
        ids.to(draw(st.sampled_from(ID_DTYPES))).to(dev),
        mask.to(dev),
    )


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view, so equality is bitwise (NaN == NaN, -0.0 != 0.0)."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def check_contract(w_in, ids_in, mask, w_out, ids_out):
    T = ids_in.shape[0]
    pad = mask[:T]
    assert w_out.dtype == w_in.dtype and ids_out.dtype == ids_in.dtype
    assert w_out.device == w_in.device and ids_out.device == ids_in.device
    assert w_out.shape == w_in.shape and ids_out.shape == ids_in.shape
    assert torch.equal(bits(w_out[~pad]), bits(w_in[~pad]))
    assert torch.equal(ids_out[~pad], ids_in[~pad])
    assert (ids_out[pad] == PAD_EXPERT_ID).all()
    assert torch.equal(bits(w_out[pad]), bits(torch.zeros_like(w_out[pad])))  # +0.0 exactly


@settings(max_examples=300, deadline=None)
@given(routing())
def test_out_of_place_contract(case):
    w, ids, mask = case
    w0, ids0 = w.clone(), ids.clone()
    w_out, ids_out = mask_padded_routes(w, ids, mask)
    check_contract(w0, ids0, mask, w_out, ids_out)
    assert torch.equal(bits(w), bits(w0)) and torch.equal(ids, ids0)  # inputs untouched


@settings(max_examples=300, deadline=None)
@given(routing())
def test_inplace_agrees_with_out_of_place(case):
    w, ids, mask = case
    ref_w, ref_ids = mask_padded_routes(w, ids, mask)
    w_out, ids_out = mask_padded_routes(w, ids, mask, inplace=True)
    assert w_out is w and ids_out is ids
    assert torch.equal(bits(w), bits(ref_w)) and torch.equal(ids, ref_ids)


@settings(max_examples=200, deadline=None)
@given(routing())
def test_idempotent(case):
    w, ids, mask = case
    once = mask_padded_routes(w, ids, mask)
    twice = mask_padded_routes(*once, mask)
    assert torch.equal(bits(once[0]), bits(twice[0])) and torch.equal(once[1], twice[1])


@settings(max_examples=250, deadline=None)
@given(routing())
def test_kernel_entry_matches_core_bit_for_bit(case):
    """CPU: the fallback; CUDA: the Triton kernel. Either way identical bits to the torch core."""
    w, ids, mask = case
    w0, ids0 = w.clone(), ids.clone()
    ref_w, ref_ids = mask_padded_routes(w, ids, mask)
    w_out, ids_out = mask_padded_routes_inplace(w, ids, mask)
    assert w_out is w and ids_out is ids
    assert torch.equal(bits(w), bits(ref_w)) and torch.equal(ids, ref_ids)
    check_contract(w0, ids0, mask, w, ids)


@settings(max_examples=100, deadline=None)
@given(routing(), st.integers(0, 2**31 - 1))
def test_mask_tail_beyond_batch_is_ignored(case, seed):
    w, ids, mask = case
    T = ids.shape[0]
    other = mask.clone()
    g = torch.Generator().manual_seed(seed)
    other[T:] = (torch.rand(mask.shape[0] - T, generator=g) < 0.5).to(mask.device)
    a = mask_padded_routes(w, ids, mask)
    b = mask_padded_routes(w, ids, other)
    assert torch.equal(bits(a[0]), bits(b[0])) and torch.equal(a[1], b[1])
    c_w, c_ids = w.clone(), ids.clone()
    mask_padded_routes_inplace(c_w, c_ids, other)
    assert torch.equal(bits(c_w), bits(a[0])) and torch.equal(c_ids, a[1])


@pytest.mark.parametrize("dev", DEVICES)
def test_all_padding_and_no_padding(dev):
    w = torch.randn(7, 8, device=dev)
    ids = torch.randint(0, 256, (7, 8), device=dev, dtype=torch.int32)
    ww, ii = mask_padded_routes(w, ids, torch.ones(7, dtype=torch.bool, device=dev))
    assert (ii == -1).all() and (ww == 0).all()
    ww, ii = mask_padded_routes(w, ids, torch.zeros(9, dtype=torch.bool, device=dev))
    assert torch.equal(ii, ids) and torch.equal(bits(ww), bits(w))
