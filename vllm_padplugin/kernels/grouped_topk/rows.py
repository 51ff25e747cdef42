"""The ``rows`` kernel: the lanes' algorithm with one thread per token.  Selectable, never served:
too few threads to hide latency, slower than ``parts`` everywhere measured (benchmarks/RESULTS.md).
"""
import triton
import triton.language as tl

from vllm_padplugin.kernels.grouped_topk.networks import _keep_best, _sigmoid_rows


@triton.jit
def _split_vec(x, BM: tl.constexpr, VEC: tl.constexpr):
    """A [BM, VEC] tile held by one thread per row -> a tuple of VEC [BM] columns, in order
    (``tl.split`` of a dimension that lives in one thread's registers costs nothing)."""
    if VEC == 4:
        a, b = tl.split(tl.reshape(x, [BM, 2, 2]))  # a: cols 0, 2; b: cols 1, 3
        x0, x2 = tl.split(a)
        x1, x3 = tl.split(b)
        return (x0, x1, x2, x3)
    else:  # VEC == 8
        a, b = tl.split(tl.reshape(x, [BM, 4, 2]))  # a: 0 2 4 6; b: 1 3 5 7
        a0, a1 = tl.split(tl.reshape(a, [BM, 2, 2]))  # a0: 0 4; a1: 2 6
        b0, b1 = tl.split(tl.reshape(b, [BM, 2, 2]))  # b0: 1 5; b1: 3 7
        e0, e4 = tl.split(a0)
        e2, e6 = tl.split(a1)
        e1, e5 = tl.split(b0)
        e3, e7 = tl.split(b1)
        return (e0, e1, e2, e3, e4, e5, e6, e7)


@triton.jit
def _grouped_topk_rows_kernel(
    logits_ptr,
    bias_ptr,
    pad_ptr,
    w_out_ptr,
    ids_out_ptr,
    T,
    stride_t,
    pad_stride,
    scale,
    G: tl.constexpr,
    S: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    TOPK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_PAD: tl.constexpr,
    RENORM: tl.constexpr,
    SKIP_PADDED_LOADS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    VEC: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FAST_SIGMOID: tl.constexpr,
    MERGE: tl.constexpr,
    LOG_TOPK: tl.constexpr,
):
    """One thread per token: every reduction is in registers, none crosses lanes.

    Pass 1 (only when some group is dropped): per group the sum of its two best biased
    scores; the ``TOPK_GROUP`` best groups kept by insertion into a sorted list
    (strict ``>``: an equal rank keeps the lower group id), then sorted by id.
    Pass 2 over the kept groups: the ``TOPK`` best values, kept sorted (per 16-byte
    chunk: sort it, bitonic merge; or insertion), ``thr`` = the k-th.  Pass 3, in
    ascending expert id: an expert is taken if its value is > ``thr``, or == ``thr``
    while fewer were taken than the k best hold (lowest id first), and written at the
    row's next slot.  The logits come from HBM once (pass 1), then from cache.
    """
    NEG: tl.constexpr = float("-inf")
    NKEEP: tl.constexpr = TOPK_GROUP if G > TOPK_GROUP else G
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < T
    live = row_ok
    if HAS_PAD:
        pad = tl.load(pad_ptr + rows.to(tl.int64) * pad_stride, mask=row_ok, other=0) != 0
        if SKIP_PADDED_LOADS:
            live = row_ok & (pad == 0)
    vv = tl.arange(0, VEC)[None, :]
    lm = live[:, None]
    rowp = logits_ptr + rows.to(tl.int64)[:, None] * stride_t + vv  # [BM, VEC]

    # ---- pass 1: group ranks; sg = the TOPK_GROUP best groups, ascending id ----
    if G > TOPK_GROUP:
        A1 = ()
        A2 = ()
        for g in tl.static_range(G):
            A1 = A1 + (tl.full([BLOCK_M], NEG, tl.float32),)
            A2 = A2 + (tl.full([BLOCK_M], NEG, tl.float32),)
        for c in range(0, S, VEC):  # all groups' chunk c at once: G loads in flight
            n1 = ()
            n2 = ()
            for g in tl.static_range(G):
                xv = _sigmoid_rows(tl.load(rowp + (g * S + c), mask=lm, other=0.0).to(tl.float32), FAST_SIGMOID)
                if HAS_BIAS:
                    xv = xv + tl.load(bias_ptr + (g * S + c) + vv).to(tl.float32)
                xs = _split_vec(xv, BLOCK_M, VEC)
                a1 = A1[g]
                a2 = A2[g]
                for j in tl.static_range(VEC):
                    a2 = tl.maximum(a2, tl.minimum(a1, xs[j]))
                    a1 = tl.maximum(a1, xs[j])
                n1 = n1 + (a1,)
                n2 = n2 + (a2,)
            A1 = n1
            A2 = n2
        gv = ()
        gi = ()
        for i in tl.static_range(TOPK_GROUP):
            gv = gv + (tl.full([BLOCK_M], NEG, tl.float32),)
            gi = gi + (tl.full([BLOCK_M], i, tl.int32),)
        for g in tl.static_range(G):
            if HAS_BIAS:
                rank = A1[g] + A2[g]
            else:
                rank = A1[g]
            cid = tl.full([BLOCK_M], g, tl.int32)
            nv = ()
            ni = ()
            for i in tl.static_range(TOPK_GROUP):
                sw = rank > gv[i]
                nv = nv + (tl.where(sw, rank, gv[i]),)
                ni = ni + (tl.where(sw, cid, gi[i]),)
                rank = tl.where(sw, gv[i], rank)
                cid = tl.where(sw, gi[i], cid)
            gv = nv
            gi = ni
        sg = ()
        for i in tl.static_range(TOPK_GROUP):
            sg = sg + (tl.full([BLOCK_M], G, tl.int32),)
        for q in tl.static_range(TOPK_GROUP):
            gc = gi[q]
            ns = ()
            for i in tl.static_range(TOPK_GROUP):
                ns = ns + (tl.minimum(sg[i], gc),)
                gc = tl.maximum(sg[i], gc)
            sg = ns

    # ---- pass 2: thr = the TOPK-th best choice among the kept groups ----
    L = ()
    for i in tl.static_range(TOPK):
        L = L + (tl.full([BLOCK_M], NEG, tl.float32),)
    for q in tl.static_range(NKEEP):
        for c in range(0, S, VEC):
            if G > TOPK_GROUP:
                e0 = (sg[q] * S + c)[:, None]  # [BM, 1]: each row its own group
                xv = _sigmoid_rows(tl.load(rowp + e0, mask=lm, other=0.0).to(tl.float32), FAST_SIGMOID)
                if HAS_BIAS:
                    xv = xv + tl.load(bias_ptr + e0 + vv).to(tl.float32)
            else:
                xv = _sigmoid_rows(tl.load(rowp + (q * S + c), mask=lm, other=0.0).to(tl.float32), FAST_SIGMOID)
                if HAS_BIAS:
                    xv = xv + tl.load(bias_ptr + (q * S + c) + vv).to(tl.float32)
            L = _keep_best(L, _split_vec(xv, BLOCK_M, VEC), VEC, TOPK, LOG_TOPK, MERGE)
    thr = L[TOPK - 1]
    need = tl.full([BLOCK_M], 1, tl.int32)  # how many values == thr the k best hold
    for i in tl.static_range(TOPK - 1):
        need += (L[i] == thr).to(tl.int32)

    # ---- pass 3: write the selected experts in ascending id ----
    ok_st = row_ok
    if HAS_PAD:
        ok_st = ok_st & (pad == 0)
    orow = rows.to(tl.int64) * TOPK
    n = tl.zeros([BLOCK_M], tl.int32)
    neq = tl.zeros([BLOCK_M], tl.int32)
    for q in tl.static_range(NKEEP):
        for c in range(0, S, VEC):
            if G > TOPK_GROUP:
                e0 = sg[q] * S + c
                sv = _sigmoid_rows(tl.load(rowp + e0[:, None], mask=lm, other=0.0).to(tl.float32), FAST_SIGMOID)
                if HAS_BIAS:
                    cvv = sv + tl.load(bias_ptr + e0[:, None] + vv).to(tl.float32)
                else:
                    cvv = sv
            else:
                e0 = tl.full([BLOCK_M], q * S + c, tl.int32)
                sv = _sigmoid_rows(tl.load(rowp + (q * S + c), mask=lm, other=0.0).to(tl.float32), FAST_SIGMOID)
                if HAS_BIAS:
                    cvv = sv + tl.load(bias_ptr + (q * S + c) + vv).to(tl.float32)
                else:
                    cvv = sv
            if not RENORM:
                sv = sv * scale
            ss = _split_vec(sv, BLOCK_M, VEC)
            cs = _split_vec(cvv, BLOCK_M, VEC)
            for j in tl.static_range(VEC):
                eq = cs[j] == thr
                take = (cs[j] > thr) | (eq & (neq < need))
                neq += eq.to(tl.int32)
                st = take & ok_st
                tl.store(ids_out_ptr + orow + n, e0 + j, mask=st)
                tl.store(w_out_ptr + orow + n, ss[j], mask=st)
                n += take.to(tl.int32)
    if RENORM:  # this thread wrote the row's weights unscaled: reload, scale in place
        ws = ()
        wsum = tl.zeros([BLOCK_M], tl.float32)
        for k in tl.static_range(TOPK):
            w = tl.load(w_out_ptr + orow + k, mask=ok_st, other=0.0)
            ws = ws + (w,)
            wsum += w
        f = scale / wsum
        for k in tl.static_range(TOPK):
            tl.store(w_out_ptr + orow + k, ws[k] * f, mask=ok_st)
    if HAS_PAD:
        pm = pad & row_ok
        for k in tl.static_range(TOPK):
            tl.store(ids_out_ptr + orow + k, tl.full([BLOCK_M], -1, tl.int32), mask=pm)
            tl.store(w_out_ptr + orow + k, tl.zeros([BLOCK_M], tl.float32), mask=pm)
