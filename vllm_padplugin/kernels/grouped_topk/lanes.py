"""What the ``parts`` and ``regs`` kernels share: a token's experts split over P lanes, the slots
from the union of the lanes' sorted lists, and the end of the writes (scaling, padded rows).
"""
import triton
import triton.language as tl

from vllm_padplugin.kernels.grouped_topk.networks import _merge8


@triton.jit
def _split_lanes(x, BM: tl.constexpr, P: tl.constexpr, VEC: tl.constexpr):
    """[BM, P, VEC] (VEC in one thread's registers) -> tuple of VEC [BM, P], in order."""
    if VEC == 4:
        a, b = tl.split(tl.reshape(x, [BM, P, 2, 2]))
        x0, x2 = tl.split(a)
        x1, x3 = tl.split(b)
        return (x0, x1, x2, x3)
    else:
        a, b = tl.split(tl.reshape(x, [BM, P, 4, 2]))
        a0, a1 = tl.split(tl.reshape(a, [BM, P, 2, 2]))
        b0, b1 = tl.split(tl.reshape(b, [BM, P, 2, 2]))
        e0, e4 = tl.split(a0)
        e2, e6 = tl.split(a1)
        e1, e5 = tl.split(b0)
        e3, e7 = tl.split(b1)
        return (e0, e1, e2, e3, e4, e5, e6, e7)


@triton.jit
def _union_slots(Lt, BM: tl.constexpr, TOPK: tl.constexpr, BFLY: tl.constexpr):
    """Per token, the lanes' sorted lists ``Lt`` (TOPK [BM, P] columns, descending) ->
    ``thr`` [BM, 1] = the TOPK-th value of their union and, per lane, its count above
    ``thr``, its count equal to ``thr`` (in its list), the ties it takes (lowest lanes =
    lowest ids first) and its first output slot.  ``BFLY`` (TOPK = 8): a butterfly merge of
    the lists (``tl.reduce`` with ``_merge8``); else TOPK pops of the lanes' heads."""
    NEG: tl.constexpr = float("-inf")
    if BFLY:
        U = tl.reduce(Lt, 1, _merge8)
        thr = U[7]
        n_gt_all = tl.zeros([BM], tl.int32)
        for k in tl.static_range(7):
            n_gt_all += (U[k] > thr).to(tl.int32)
        need = TOPK - n_gt_all
    else:
        H = Lt
        cum = tl.zeros([BM], tl.int32)
        thr = tl.full([BM], NEG, tl.float32)
        for _ in tl.static_range(TOPK):
            m = tl.max(H[0], axis=1)
            hit = H[0] == m[:, None]
            upd = cum < TOPK
            thr = tl.where(upd, m, thr)
            cum = tl.where(upd, cum + tl.sum(hit.to(tl.int32), axis=1), cum)
            nh = ()
            for k in tl.static_range(TOPK - 1):
                nh = nh + (tl.where(hit, H[k + 1], H[k]),)
            H = nh + (tl.where(hit, NEG, H[TOPK - 1]),)
    t2 = thr[:, None]
    n_gt = tl.zeros_like(Lt[0]).to(tl.int32)
    n_eq = tl.zeros_like(Lt[0]).to(tl.int32)
    for k in tl.static_range(TOPK):
        n_gt += (Lt[k] > t2).to(tl.int32)
        n_eq += (Lt[k] == t2).to(tl.int32)
    if not BFLY:
        need = TOPK - tl.sum(n_gt, axis=1)  # ties to take, lowest ids (lanes) first
    eq_before = tl.cumsum(n_eq, axis=1) - n_eq
    take_eq = tl.minimum(tl.maximum(need[:, None] - eq_before, 0), n_eq)
    n_take = n_gt + take_eq
    off = tl.cumsum(n_take, axis=1) - n_take  # first output slot of each lane
    return t2, n_gt, n_eq, take_eq, off


@triton.jit
def _lanes_finish(w_out_ptr, ids_out_ptr, obase, lane, wsum, scale, ok_st, row_ok, pad, BM: tl.constexpr,
                  P: tl.constexpr, TOPK: tl.constexpr, RENORM: tl.constexpr, HAS_PAD: tl.constexpr):
    """End of the lanes kernels: the lanes wrote unscaled weights, so after a barrier lane p
    scales slots p, p + P, ..; padded rows get (-1, 0) (with renormalisation from the same
    weight store).  The row flags ``ok_st`` / ``row_ok`` / ``pad`` are [BM, 1] or [BM, P]."""
    if RENORM:
        f = (scale / tl.sum(wsum, axis=1))[:, None]
        tl.debug_barrier()
        for k0 in tl.static_range(0, TOPK, P):
            slot = k0 + lane
            sm = ok_st & (slot < TOPK)
            w = tl.load(w_out_ptr + obase + slot, mask=sm, other=0.0)
            if HAS_PAD:  # one weight store for routed and padded rows
                pm = (pad & row_ok) & (slot < TOPK)
                tl.store(w_out_ptr + obase + slot, tl.where(sm, w * f, 0.0), mask=sm | pm)
                tl.store(ids_out_ptr + obase + slot, tl.full([BM, P], -1, tl.int32), mask=pm)
            else:
                tl.store(w_out_ptr + obase + slot, w * f, mask=sm)
    elif HAS_PAD:
        for k0 in tl.static_range(0, TOPK, P):
            slot = k0 + lane
            pm = (pad & row_ok) & (slot < TOPK)
            tl.store(ids_out_ptr + obase + slot, tl.full([BM, P], -1, tl.int32), mask=pm)
            tl.store(w_out_ptr + obase + slot, tl.zeros([BM, P], tl.float32), mask=pm)
