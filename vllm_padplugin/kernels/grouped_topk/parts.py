"""The ``parts`` kernel: P lanes a token, each lane's experts streamed through its sorted list
(served from 4096 tokens where "regs" does not apply).
"""
import triton
import triton.language as tl

from vllm_padplugin.kernels.grouped_topk.lanes import _lanes_finish, _split_lanes, _union_slots
from vllm_padplugin.kernels.grouped_topk.networks import _keep_best, _sigmoid_rows


@triton.jit
def _grouped_topk_parts_kernel(
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
    P: tl.constexpr,
    SP: tl.constexpr,
    LPG: tl.constexpr,
):
    """P lanes per token, lane p holding experts [p SP, (p + 1) SP): its group when
    groups are dropped (P = G), else a slice.  In-lane work as in the rows kernel;
    across the P lanes only small reductions / scans of one value per lane.

    Pass 1 (P = G): each lane its group's rank (two best biased scores); the
    ``TOPK_GROUP`` best lanes by max + lowest-lane passes; with ``LPG`` > 0 the kept
    groups are then spread over all lanes (``LPG`` lanes per kept group, in ascending
    expert order), else the lanes of dropped groups idle.  Pass 2: each lane its
    ``TOPK`` best values (sorted tuple); ``thr`` = the k-th of their union, by ``TOPK``
    pops of the lanes' heads; per lane the count above ``thr`` and the ties it gets
    (lowest ids first) give its output slots (exclusive scan over lanes).  Pass 3: each
    lane writes its taken experts in ascending id; the weights are scaled after a barrier.
    """
    NEG: tl.constexpr = float("-inf")
    SQ: tl.constexpr = S // LPG if LPG > 0 else SP  # experts per lane in passes 2-3
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < T
    live = row_ok
    pad = tl.zeros([BLOCK_M], tl.int1)  # no mask: no row is padded
    if HAS_PAD:
        pad = tl.load(pad_ptr + rows.to(tl.int64) * pad_stride, mask=row_ok, other=0) != 0
        if SKIP_PADDED_LOADS:
            live = row_ok & (pad == 0)
    lane = tl.arange(0, P)[None, :]  # [1, P]
    vv = tl.arange(0, VEC)[None, None, :]
    e_lane = lane * SP  # first expert of each lane
    rowp = logits_ptr + rows.to(tl.int64)[:, None, None] * stride_t + e_lane[:, :, None] + vv  # [BM, P, VEC]
    bp = bias_ptr + e_lane[:, :, None] + vv  # [1, P, VEC]
    lm = live[:, None, None]

    if G > TOPK_GROUP:  # P == G: lane = group
        a1 = tl.full([BLOCK_M, P], NEG, tl.float32)
        a2 = tl.full([BLOCK_M, P], NEG, tl.float32)
        for c in range(0, SP, VEC):
            xv = _sigmoid_rows(tl.load(rowp + c, mask=lm, other=0.0).to(tl.float32), FAST_SIGMOID)
            if HAS_BIAS:
                xv = xv + tl.load(bp + c).to(tl.float32)
            xs = _split_lanes(xv, BLOCK_M, P, VEC)
            for j in tl.static_range(VEC):
                a2 = tl.maximum(a2, tl.minimum(a1, xs[j]))
                a1 = tl.maximum(a1, xs[j])
        if HAS_BIAS:
            r = a1 + a2
        else:
            r = a1
        keep = tl.zeros([BLOCK_M, P], dtype=tl.int1)
        for _ in tl.static_range(TOPK_GROUP):
            m = tl.max(r, axis=1)
            gi = tl.min(tl.where(r == m[:, None], lane, P), axis=1)
            hit = lane == gi[:, None]
            keep = keep | hit
            r = tl.where(hit, NEG, r)
    else:
        keep = tl.full([BLOCK_M, P], 1, tl.int1)
    if LPG > 0:  # the kept groups, ascending id, spread over all lanes: LPG lanes each
        taken = keep
        sg = ()
        for i in tl.static_range(TOPK_GROUP):
            gi = tl.min(tl.where(taken, lane, P), axis=1)
            sg = sg + (gi,)
            taken = taken & (lane != gi[:, None])
        myg = tl.zeros([BLOCK_M, P], tl.int32)
        for i in tl.static_range(TOPK_GROUP):
            myg = tl.where(lane // LPG == i, sg[i][:, None], myg)
        e_lane = myg * S + (lane % LPG) * SQ  # [BM, P]: first expert of each lane's slice
        rowp = logits_ptr + rows.to(tl.int64)[:, None, None] * stride_t + e_lane[:, :, None] + vv
        bp = bias_ptr + e_lane[:, :, None] + vv
        keep = tl.full([BLOCK_M, P], 1, tl.int1)
    km = lm & keep[:, :, None]

    # pass 2: each lane's TOPK best values
    Lt = ()
    for i in tl.static_range(TOPK):
        Lt = Lt + (tl.full([BLOCK_M, P], NEG, tl.float32),)
    for c in range(0, SQ, VEC):
        xv = _sigmoid_rows(tl.load(rowp + c, mask=km, other=0.0).to(tl.float32), FAST_SIGMOID)
        if HAS_BIAS:
            xv = xv + tl.load(bp + c).to(tl.float32)
        if LPG == 0:
            xv = tl.where(keep[:, :, None], xv, NEG)
        Lt = _keep_best(Lt, _split_lanes(xv, BLOCK_M, P, VEC), VEC, TOPK, LOG_TOPK, MERGE)
    t2, n_gt, n_eq, take_eq, off = _union_slots(Lt, BLOCK_M, TOPK, False)

    # pass 3: each lane writes its taken experts, ascending id
    ok_st = row_ok
    if HAS_PAD:
        ok_st = ok_st & (pad == 0)
    ok2 = ok_st[:, None] & keep
    orow = rows.to(tl.int64)[:, None] * TOPK + off  # [BM, P]
    n = tl.zeros([BLOCK_M, P], tl.int32)
    neq = tl.zeros([BLOCK_M, P], tl.int32)
    wsum = tl.zeros([BLOCK_M, P], tl.float32)
    for c in range(0, SQ, VEC):
        sv = _sigmoid_rows(tl.load(rowp + c, mask=km, other=0.0).to(tl.float32), FAST_SIGMOID)
        if HAS_BIAS:
            cvv = sv + tl.load(bp + c).to(tl.float32)
        else:
            cvv = sv
        if LPG == 0:
            cvv = tl.where(keep[:, :, None], cvv, NEG)
        if not RENORM:
            sv = sv * scale
        ss = _split_lanes(sv, BLOCK_M, P, VEC)
        cs = _split_lanes(cvv, BLOCK_M, P, VEC)
        for j in tl.static_range(VEC):
            eq = cs[j] == t2
            take = (cs[j] > t2) | (eq & (neq < take_eq))
            neq += eq.to(tl.int32)
            st = take & ok2
            tl.store(ids_out_ptr + orow + n, e_lane + (c + j), mask=st)
            tl.store(w_out_ptr + orow + n, ss[j], mask=st)
            if RENORM:
                wsum += tl.where(take, ss[j], 0.0)
            n += take.to(tl.int32)
    obase = rows.to(tl.int64)[:, None] * TOPK
    _lanes_finish(w_out_ptr, ids_out_ptr, obase, lane, wsum, scale, ok_st[:, None], row_ok[:, None], pad[:, None],
                  BLOCK_M, P, TOPK, RENORM, HAS_PAD)
