"""The ``tile`` kernel: one warp per token on a flat [BLOCK_M, E] tile, value-only top-k passes
(served below 4096 tokens where "regs" does not apply).
"""
import triton
import triton.language as tl

from vllm_padplugin.kernels.grouped_topk.networks import _top2


@triton.jit
def _grouped_topk_kernel(
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
    BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    NEG: tl.constexpr = float("-inf")
    BIG: tl.constexpr = G * S
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < T
    live = row_ok
    if HAS_PAD:
        pad = tl.load(pad_ptr + rows.to(tl.int64) * pad_stride, mask=row_ok, other=0) != 0
        if SKIP_PADDED_LOADS:  # big batches: padded rows read no logits (bandwidth-bound)
            live = row_ok & (pad == 0)
    EP: tl.constexpr = BLOCK_G * BLOCK_S
    f = tl.arange(0, EP)[None, :]  # flat tile index; expert = group * S + slot
    grp = f // BLOCK_S
    expert = grp * S + f % BLOCK_S
    e_ok = (grp < G) & (f % BLOCK_S < S)
    valid = e_ok & live[:, None]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(logits_ptr + rows64 * stride_t + expert, mask=valid, other=0.0).to(tl.float32)
    scores = tl.sigmoid(x)
    if HAS_BIAS:
        choice = scores + tl.load(bias_ptr + expert, mask=e_ok, other=0.0).to(tl.float32)
    else:
        choice = scores
    choice = tl.where(valid, choice, NEG)

    eligible = choice
    if G > 1:
        c3 = tl.reshape(choice, [BLOCK_M, BLOCK_G, BLOCK_S])
        if HAS_BIAS:  # a group's rank = the sum of its two best biased scores
            a1, a2 = tl.reduce((c3, tl.full(c3.shape, NEG, tl.float32)), 2, _top2)
            rank = a1 + a2
        else:
            rank = tl.max(c3, axis=2)
        g2 = tl.arange(0, BLOCK_G)[None, :]
        rank = tl.where(g2 < G, rank, NEG)
        keep = tl.zeros([BLOCK_M, EP], dtype=tl.int1)
        for _ in tl.static_range(TOPK_GROUP):
            best = tl.max(rank, axis=1)
            gi = tl.min(tl.where(rank == best[:, None], g2, BLOCK_G), axis=1)
            rank = tl.where(g2 == gi[:, None], NEG, rank)
            keep = keep | (grp == gi[:, None])
        eligible = tl.where(keep, choice, NEG)

    # k value-only passes: thr = the k-th distinct best eligible choice
    v = eligible
    thr = tl.full([BLOCK_M], NEG, tl.float32)
    for _ in tl.static_range(TOPK):
        thr = tl.max(v, axis=1)
        v = tl.where(v == thr[:, None], NEG, v)
    sel = eligible >= thr[:, None]
    count = tl.sum(sel.to(tl.int32), axis=1)
    count = tl.where(live, count, TOPK)
    if tl.max(count, axis=0) > TOPK:
        # a tie among the k best values in some row: exact passes, lowest id first
        v = eligible
        sel = tl.zeros([BLOCK_M, EP], dtype=tl.int1)
        for _ in tl.static_range(TOPK):
            m = tl.max(v, axis=1)
            pick = tl.min(tl.where(v == m[:, None], f, EP), axis=1)
            took = f == pick[:, None]
            sel = sel | took
            v = tl.where(took, NEG, v)

    w = tl.where(sel, scores, 0.0)
    if RENORM:
        w = w * (scale / tl.sum(w, axis=1))[:, None]
    else:
        w = w * scale
    # rank of each selected expert among the row's selected ones, in expert order
    pos = tl.cumsum(sel.to(tl.int32), axis=1) - 1
    st = sel & (pos < TOPK) & row_ok[:, None]
    if HAS_PAD:
        st = st & (pad == 0)[:, None]
    o = rows.to(tl.int64)[:, None] * TOPK + pos
    tl.store(ids_out_ptr + o, expert + tl.zeros_like(pos), mask=st)
    tl.store(w_out_ptr + o, w, mask=st)
    if HAS_PAD:
        kcol = tl.arange(0, BLOCK_K)[None, :]
        pm = (pad & row_ok)[:, None] & (kcol < TOPK)
        op = rows.to(tl.int64)[:, None] * TOPK + kcol
        tl.store(ids_out_ptr + op, tl.full([BLOCK_M, BLOCK_K], -1, tl.int32), mask=pm)
        tl.store(w_out_ptr + op, tl.zeros([BLOCK_M, BLOCK_K], tl.float32), mask=pm)
