"""Pieces the kernels share: the fast sigmoid, descending sorting networks of 4 / 8
columns, the bitonic merges of sorted lists and the (best, second best) combine.
"""
import triton
import triton.language as tl


@triton.jit
def _top2(a1, a2, b1, b2):
    """Combine two (best, second best) pairs; duplicates count twice, like topk(2)."""
    return tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2))


@triton.jit
def _sigmoid_rows(x, FAST: tl.constexpr):
    """1 / (1 + 2^(-x log2 e)) with the approximate ex2 / rcp of the SFU (4 instructions,
    no denormal fix-ups; within ~2 ulp of torch's sigmoid, like ``tl.sigmoid``'s
    ex2.approx + div.full).  The CPU interpreter cannot run PTX: ``tl.sigmoid`` there."""
    if FAST:
        e = tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * -1.4426950408889634], dtype=tl.float32, is_pure=True, pack=1
        )
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [e + 1.0], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.sigmoid(x)


@triton.jit
def _ce(a, b):
    """A compare-exchange of a descending network: (the larger, the smaller)."""
    return tl.maximum(a, b), tl.minimum(a, b)


@triton.jit
def _sort_desc(xs, VEC: tl.constexpr):
    """Sort a tuple of 4 or 8 [BM] columns, descending (optimal comparator networks)."""
    if VEC == 4:
        x0, x1, x2, x3 = xs
        x0, x1 = _ce(x0, x1)
        x2, x3 = _ce(x2, x3)
        x0, x2 = _ce(x0, x2)
        x1, x3 = _ce(x1, x3)
        x1, x2 = _ce(x1, x2)
        return (x0, x1, x2, x3)
    else:
        x0, x1, x2, x3, x4, x5, x6, x7 = xs
        x0, x1 = _ce(x0, x1)
        x2, x3 = _ce(x2, x3)
        x4, x5 = _ce(x4, x5)
        x6, x7 = _ce(x6, x7)
        x0, x2 = _ce(x0, x2)
        x1, x3 = _ce(x1, x3)
        x4, x6 = _ce(x4, x6)
        x5, x7 = _ce(x5, x7)
        x1, x2 = _ce(x1, x2)
        x5, x6 = _ce(x5, x6)
        x0, x4 = _ce(x0, x4)
        x3, x7 = _ce(x3, x7)
        x1, x5 = _ce(x1, x5)
        x2, x6 = _ce(x2, x6)
        x1, x4 = _ce(x1, x4)
        x3, x6 = _ce(x3, x6)
        x2, x4 = _ce(x2, x4)
        x3, x5 = _ce(x3, x5)
        x3, x4 = _ce(x3, x4)
        return (x0, x1, x2, x3, x4, x5, x6, x7)


@triton.jit
def _bitonic_sort(c, K: tl.constexpr, LOG_K: tl.constexpr):
    """A bitonic sequence of K (= 2^LOG_K) values, sorted descending: half-cleaners at
    distance K/2, K/4, .., 1."""
    for st in tl.static_range(LOG_K):
        nc = ()
        for i in tl.static_range(K):
            if (i & (K >> (st + 1))) == 0:
                nc = nc + (tl.maximum(c[i], c[i ^ (K >> (st + 1))]),)
            else:
                nc = nc + (tl.minimum(c[i], c[i ^ (K >> (st + 1))]),)
        c = nc
    return c


@triton.jit
def _keep_best(L, xs, VEC: tl.constexpr, K: tl.constexpr, LOG_K: tl.constexpr, MERGE: tl.constexpr):
    """L (K values, descending) := the K best of L and the VEC new values xs."""
    if MERGE:  # sort the chunk, pair L[i] with the chunk reversed (a bitonic top-K), clean up
        b = _sort_desc(xs, VEC)
        c = ()
        for i in tl.static_range(K):
            if i >= K - VEC:
                c = c + (tl.maximum(L[i], b[K - 1 - i]),)
            else:
                c = c + (L[i],)
        return _bitonic_sort(c, K, LOG_K)
    else:  # insertion: a max / min pair per slot and value
        for j in tl.static_range(VEC):
            cv = xs[j]
            nl = ()
            for i in tl.static_range(K):
                nl = nl + (tl.maximum(L[i], cv),)
                cv = tl.minimum(L[i], cv)
            L = nl
        return L


@triton.jit
def _merge8(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7):
    """Top 8 of two descending 8-lists, descending: pair a_i with b_(7-i) (a bitonic
    sequence), then half-cleaners at distance 4, 2, 1.  Associative and commutative, so
    ``tl.reduce`` can use it: a butterfly merge of the lanes' lists in 3 shuffle rounds."""
    return _bitonic_sort((tl.maximum(a0, b7), tl.maximum(a1, b6), tl.maximum(a2, b5), tl.maximum(a3, b4),
                          tl.maximum(a4, b3), tl.maximum(a5, b2), tl.maximum(a6, b1), tl.maximum(a7, b0)), 8, 3)
