"""For "regs": a token's threshold, the 8th best of the union of its lanes' sorted lists, by a
butterfly over the lanes (``_lanes_thr``), of sorted 8s or of sorted 8s held by pairs of lanes.
"""
import triton
import triton.language as tl

from vllm_padplugin.kernels.grouped_topk.networks import _bitonic_sort, _keep_best, _merge8, _sort_desc


@triton.jit
def _top_sorted(cv, SP: tl.constexpr, K: tl.constexpr):
    """The K (4 or 8) best of a lane's SP choices ``cv``, descending: a sorting network on the
    first K, then per K more a sort and a bitonic merge."""
    L = _sort_desc(cv[0:K], K)
    for c in tl.static_range(K, SP, K):
        L = _keep_best(L, cv[c:c + K], K, K, K.bit_length() - 1, True)
    return L


@triton.jit
def _kept(L, keep):
    """A lane's list ``L`` with its values at -inf where its group is dropped (``keep`` false)."""
    out = ()
    for k in tl.static_range(len(L)):
        out = out + (tl.where(keep, L[k], float("-inf")),)
    return out


@triton.jit
def _pair_thr8(L, lane, BM: tl.constexpr, P: tl.constexpr):
    """The 8th best of the union of the P lanes' descending lists ``L`` (4 or 8 [BM, P] columns),
    in every lane, with a sorted 8 held by a pair of lanes (2q: its best 4, 2q + 1: the next
    4): a merge round then moves 4 values a lane instead of 8 and sorts 4 where
    ``_merge8`` sorts 8 (SASS: ~40 -> ~28 instructions a round; ptxas issues the pair's
    half-cleaner as a max and a predicated min).  Merging two pairs, a lane
    takes the other pair's half of the other rank, reversed (lane ^ 2^r ^ 1); the 8 maxima
    form a bitonic 8 that a half-cleaner across the pair (lane ^ 1: the upper lane keeps the
    max, the lower the min) and a bitonic sort of 4 a lane put in order.  The first round
    builds the pairs: the lower lane computes its half reversed (the same registers move for
    both lanes), still bitonic.  The last round needs only the minimum of the 8 maxima."""
    ln = tl.broadcast_to(lane, [BM, P])
    lo = (ln & 1) != 0
    o = ln ^ 1
    if len(L) == 4:  # two 4-lists: L[k] against the other's L[3 - k]
        c = ()
        for k in tl.static_range(4):
            x = tl.gather(L[3 - k], o, 1)
            c = c + (tl.where(lo, tl.minimum(L[k], x), tl.maximum(L[k], x)),)
    else:  # two 8-lists: their bitonic top 8 (the lower lane's reversed), halved across the pair
        n = ()
        for k in tl.static_range(8):
            n = n + (tl.maximum(L[k], tl.gather(L[7 - k], o, 1)),)
        c = ()
        for k in tl.static_range(4):
            c = c + (tl.where(lo, tl.minimum(n[k], n[k + 4]), tl.maximum(n[k], n[k + 4])),)
    c = _bitonic_sort(c, 4, 2)
    LOG_P: tl.constexpr = P.bit_length() - 1
    for r in tl.static_range(LOG_P - 1):
        q = ln ^ ((2 << r) | 1)
        m = ()
        for k in tl.static_range(4):
            m = m + (tl.maximum(c[k], tl.gather(c[3 - k], q, 1)),)
        if r < LOG_P - 2:
            c = ()
            for k in tl.static_range(4):
                y = tl.gather(m[k], o, 1)
                c = c + (tl.where(lo, tl.minimum(m[k], y), tl.maximum(m[k], y)),)
            c = _bitonic_sort(c, 4, 2)
        else:
            t = tl.minimum(tl.minimum(m[0], m[1]), tl.minimum(m[2], m[3]))
            c = (tl.minimum(t, tl.gather(t, o, 1)),)
    return c[0]


@triton.jit
def _lanes_thr(L, keep, lane, BM: tl.constexpr, P: tl.constexpr, PAIRS: tl.constexpr):
    """The 8th best of the union of the lanes' descending lists ``L`` (4 or 8 [BM, P] columns);
    +inf in the lanes of dropped groups (``keep`` false), which take nothing.  4-lists, or
    ``PAIRS``: ``_pair_thr8``; else a butterfly of 8-lists (``tl.reduce`` with ``_merge8``).
    (A butterfly of 4-lists, sorted 8s from the first round on, lost to the pairs on an H100 at
    every timed size, 4096-32768 tokens: benchmarks/RESULTS.md, 2026-12-07.)"""
    if PAIRS or len(L) == 4:
        t = _pair_thr8(L, lane, BM, P)
    else:
        t = tl.reduce(L, 1, _merge8)[7][:, None]
    return tl.where(keep, t, float("inf"))
