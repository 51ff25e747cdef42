"""The persistent padding mask (pure torch): fill semantics, no allocation per step, graph safety."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_padplugin.padding_mask import PaddingMask, micro_batch_mask, padded_length


def reference(num_unpadded: int, num_padded: int) -> torch.Tensor:
    return torch.arange(num_padded) >= num_unpadded


@pytest.mark.parametrize(
    "unpadded,padded",
    [(5, 8), (0, 8), (8, 8), (0, 0), (1, 1), (16, 16), (3, 16)],
    ids=["mix", "all-padding", "no-padding", "empty", "one-real", "full", "mostly-padding"],
)
def test_prepare_marks_rows_from_unpadded_to_padded(unpadded, padded):
    mask = PaddingMask(16, "cpu")
    out = mask.prepare(unpadded, padded)
    assert out.dtype == torch.bool and out.shape == (padded,)
    assert torch.equal(out, reference(unpadded, padded))


def test_unpadded_beyond_padded_is_clamped_to_no_padding():
    out = PaddingMask(8, "cpu").prepare(10, 6)
    assert not out.any() and out.shape == (6,)


def test_refill_overwrites_the_previous_step_and_keeps_the_address():
    """Same buffer every step: a captured graph reading it sees each step's mask."""
    mask = PaddingMask(32, "cpu")
    ptr = mask.buffer.data_ptr()
    steps = [(3, 8), (8, 8), (0, 4), (20, 32), (1, 2)]
    for unpadded, padded in steps:
        out = mask.prepare(unpadded, padded)
        assert out.data_ptr() == ptr, "prepare() must return a view of the persistent buffer"
        assert out.untyped_storage().data_ptr() == mask.buffer.untyped_storage().data_ptr()
        assert torch.equal(out, reference(unpadded, padded))
    assert mask.buffer.data_ptr() == ptr and mask.capacity == 32


@given(
    capacity=st.integers(0, 64),
    steps=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 64)), min_size=1, max_size=6),
)
@settings(max_examples=200, deadline=None)
def test_any_sequence_of_steps_matches_the_reference(capacity, steps):
    mask = PaddingMask(capacity, "cpu")
    for unpadded, padded in steps:
        if padded > capacity:
            with pytest.raises(ValueError, match=f"{padded} tokens .* {capacity} rows"):
                mask.prepare(unpadded, padded)
            continue
        assert torch.equal(mask.prepare(unpadded, padded), reference(min(unpadded, padded), padded))


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True, None])
def test_bad_capacity_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="capacity must be an int"):
        PaddingMask(bad, "cpu")


def test_bad_counts_are_one_clear_error():
    mask = PaddingMask(4, "cpu")
    with pytest.raises(ValueError, match="5 tokens does not fit the padding mask of 4 rows"):
        mask.prepare(1, 5)
    with pytest.raises(ValueError, match="num_unpadded must be >= 0"):
        mask.prepare(-1, 2)
    assert not mask.fits(5) and not mask.fits(-1) and mask.fits(4)


def test_micro_batch_mask_is_a_view_of_the_outer_mask():
    outer = PaddingMask(8, "cpu").prepare(5, 8)
    first, second = micro_batch_mask(outer, slice(0, 4)), micro_batch_mask(outer, slice(4, 8))
    assert torch.equal(first, reference(5, 8)[0:4]) and torch.equal(second, reference(5, 8)[4:8])
    assert second.data_ptr() == outer.data_ptr() + 4   # bools: one byte each, no copy
    assert micro_batch_mask(None, slice(0, 4)) is None


def test_padded_length_covers_micro_batch_slices():
    assert padded_length(8) == 8
    assert padded_length(4, [slice(0, 4), slice(4, 8)]) == 8   # DBO dummy run: per-micro-batch count
    assert padded_length(None, [slice(0, 3)]) == 3
    assert padded_length(None) is None


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
def test_fill_does_not_allocate_on_cuda():
    mask = PaddingMask(4096, "cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    ptrs = {mask.prepare(u, p).data_ptr() for u, p in [(10, 64), (0, 4096), (4096, 4096), (1, 2)]}
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert ptrs == {mask.buffer.data_ptr()}


def _capture(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()                                     # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


@pytest.mark.gpu
@needs_gpu
def test_cuda_graph_reads_the_refilled_mask_on_replay():
    """A graph captured once sees every later step's mask, filled outside it as the runner does."""
    torch.manual_seed(0)
    n, k = 64, 8
    mask = PaddingMask(256, "cuda")
    ids = torch.randint(0, 256, (n, k), device="cuda", dtype=torch.int32)
    weights = torch.rand(n, k, device="cuda")
    out_ids, out_w = torch.empty_like(ids), torch.empty_like(weights)
    view = mask.prepare(n, n).unsqueeze(-1)

    def body():
        out_ids.copy_(ids.masked_fill(view, -1))
        out_w.copy_(weights.masked_fill(view, 0.0))

    graph = _capture(body)
    for unpadded in (40, 7, 0, n):
        mask.prepare(unpadded, n)
        graph.replay()
        torch.cuda.synchronize()
        pad = reference(unpadded, n).cuda()
        assert (out_ids[pad] == -1).all() and not out_w[pad].any()
        assert torch.equal(out_ids[~pad], ids[~pad]) and torch.equal(out_w[~pad], weights[~pad])


@pytest.mark.gpu
@needs_gpu
def test_prepare_itself_is_capturable():
    """No host sync and no allocation inside prepare(): capture would raise otherwise."""
    mask = PaddingMask(256, "cuda")
    mask.prepare(0, 256)
    graph = _capture(lambda: mask.prepare(40, 64))
    mask.buffer.fill_(False)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(mask.buffer[:64].cpu(), reference(40, 64))
    assert not mask.buffer[64:].any()
