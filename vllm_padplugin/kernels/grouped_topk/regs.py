"""The "regs" kernel, served wherever it applies: P lanes a token whose logits stay in registers.
:mod:`vllm_padplugin.kernels.triton_grouped_topk` says how it works and which build serves which batch.
"""
import triton
import triton.language as tl

from vllm_padplugin.kernels.grouped_topk.lanes import _lanes_finish, _split_lanes, _union_slots
from vllm_padplugin.kernels.grouped_topk.networks import _sigmoid_rows, _top2
from vllm_padplugin.kernels.grouped_topk.regs_bits import _bits, _bits_ties, _lowest_bits, _popc, _slots_write
from vllm_padplugin.kernels.grouped_topk.regs_union import _kept, _lanes_thr, _top_sorted


@triton.jit
def _chunk_choices(xs, bp, BM: tl.constexpr, P: tl.constexpr, VEC: tl.constexpr, NCH: tl.constexpr,
                   HAS_BIAS: tl.constexpr, FAST: tl.constexpr, FLAT: tl.constexpr = False,
                   BF16_PAIRS: tl.constexpr = False):
    """A lane's choices (sigmoid + bias) from its NCH loaded chunks of logits ``xs``, as a
    tuple of NCH x VEC [BM, P] columns in ascending expert id.  ``FLAT``: the chunks are
    [1, BM P, VEC] (``_flat``), each column reshaped to [BM, P].  ``BF16_PAIRS`` (bf16 logits):
    converted by ``_bf16_pairs_to_f32`` (the interpreter: ``.to``)."""
    cv = ()
    for ci in tl.static_range(NCH):
        if BF16_PAIRS and FAST:
            x = _bf16_pairs_to_f32(xs[ci])
        else:
            x = xs[ci].to(tl.float32)
        xv = _sigmoid_rows(x, FAST)
        if HAS_BIAS:
            xv = xv + tl.load(bp + ci * VEC).to(tl.float32)
        if FLAT:
            cols = _split_lanes(xv, 1, BM * P, VEC)
            for c in tl.static_range(VEC):
                cv = cv + (tl.reshape(cols[c], [BM, P]),)
        else:
            cv = cv + _split_lanes(xv, BM, P, VEC)
    return cv


@triton.jit
def _bf16_pairs_to_f32(x):
    """bf16 -> f32, two logits a 32-bit register: the lower one the register shifted up 16 bits,
    the upper one the register with its low 16 bits cleared, one integer instruction a logit
    (ptxas converts the upper one with a byte permute and a shift)."""
    return tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xFFFF0000; }", "=r,=r,r", [x],
                                     dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def _flat(x, BM: tl.constexpr, P: tl.constexpr):
    """[BM, P] (or [BM, 1]) -> [1, BM P, 1], lane fastest: the shape of ``FLAT`` loads."""
    return tl.reshape(tl.broadcast_to(x, [BM, P]), [1, BM * P])[:, :, None]


@triton.jit
def _lane_logits(rowp, lm, VEC: tl.constexpr, NCH: tl.constexpr):
    """A lane's NCH 16-byte chunks of logits, every load issued before any is used."""
    xs = ()
    for ci in tl.static_range(NCH):
        xs = xs + (tl.load(rowp + ci * VEC, mask=lm, other=0.0),)
    return xs


@triton.jit
def _lane_choices(rowp, bp, lm, BM: tl.constexpr, P: tl.constexpr, VEC: tl.constexpr, NCH: tl.constexpr,
                  HAS_BIAS: tl.constexpr, FAST: tl.constexpr, FLAT: tl.constexpr, BF16_PAIRS: tl.constexpr):
    """``_chunk_choices`` of the lane's logits loaded again (from cache)."""
    return _chunk_choices(_lane_logits(rowp, lm, VEC, NCH), bp, BM, P, VEC, NCH, HAS_BIAS, FAST,
                          FLAT, BF16_PAIRS)


@triton.jit
def _group_keep(h1, h2, lane, BM: tl.constexpr, P: tl.constexpr, G: tl.constexpr, TOPK_GROUP: tl.constexpr,
                HAS_BIAS: tl.constexpr):
    """Which lanes' groups are kept, [BM, P], from the lanes' two best choices ``h1``, ``h2``
    (a group = P / G neighbouring lanes).  A group's rank (sum of its two best; its best
    without a bias) is compared with every other group's, one shuffle each, all independent:
    a group is kept when fewer than ``TOPK_GROUP`` groups rank higher or equal with a lower
    id.  (``TOPK_GROUP`` rounds of max + lowest-id argmax are two dependent butterfly
    reductions a round.)"""
    LG: tl.constexpr = P // G
    ln = tl.broadcast_to(lane, [BM, P])
    for b in tl.static_range(LG.bit_length() - 1):  # the group's two best over its lanes
        o = ln ^ (1 << b)
        h1, h2 = _top2(h1, h2, tl.gather(h1, o, 1), tl.gather(h2, o, 1))
    if HAS_BIAS:
        r = h1 + h2
    else:
        r = h1
    g = ln // LG
    above = tl.zeros([BM, P], tl.int32)
    for d in tl.static_range(1, G):
        rq = tl.gather(r, ln ^ (d * LG), 1)  # group g ^ d: a lower id iff g has d's top bit
        above += ((rq > r) | ((rq == r) & ((g & (1 << (d.bit_length() - 1))) != 0))).to(tl.int32)
    return above < TOPK_GROUP


@triton.jit
def _grouped_topk_regs_kernel(
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
    P: tl.constexpr,
    SP: tl.constexpr,
    LPG: tl.constexpr,
    SHORT_CHAIN: tl.constexpr = False,
    EARLY_FLAG: tl.constexpr = False,
    TOP4: tl.constexpr = False,
    PAIRS: tl.constexpr = False,
    PAD_RELOAD: tl.constexpr = False,
    FLAT: tl.constexpr = False,
    BF16_PAIRS: tl.constexpr = False,
):
    """P lanes per token, lane p holding experts [p SP, (p + 1) SP) (its group when groups
    are dropped: P = G) in registers for the whole kernel: every logit is read and put
    through the sigmoid once.  ``TOPK`` = 8 = the sort chunk.

    A lane loads all its logits at once, sorts its choices to its 8 best (sorting network
    per 8, bitonic merges); a group's rank is the sum of its list's two heads (its head
    without a bias); the ``TOPK_GROUP`` best lanes are kept (lowest id on ties), the others'
    lists emptied; ``thr`` and the lanes' slots come from ``_union_slots``.  A lane then
    marks its taken experts in a bit mask (>= ``thr``; an exact lowest-id count of the ties
    only in a block where some lane takes part of its ties).  Up to 32 logits a lane,
    ``_slots_write`` then has lane s write output slot s; with more, each lane writes its own
    by popping the mask's lowest bit.  The weight of a taken expert is its sigmoid,
    recomputed from one cached load.  ``LPG`` is unused.  ``SHORT_CHAIN`` (served where it won,
    ``short_chain_served``) ranks the groups by ``_group_keep`` and counts the taken bits
    instead of the lists' values above and at thr, the ties only where a row has more than
    ``TOPK`` values >= thr.  ``TOP4`` (with it): lanes sort their 4 best (``top4_served``), the
    threshold by ``_pair_thr8``, and where a lane holds <= 32 logits the output written in each
    branch of the block's exactness test, the common one knowing a lane takes <= 4.  ``PAIRS``:
    the 8-lists' threshold by ``_pair_thr8`` too (``pair_union_served``).  ``PAD_RELOAD``: the
    padding flag loaded again after the routing for the writes, so that it holds no register across
    the routing: under the 64-register cap ptxas otherwise sinks a logits load below the first
    sigmoids (masked 16-bit DeepSeek-V3 with the pairs, SASS from Triton 3.6's ptxas).  ``FLAT``:
    the logits and bias loaded as [1, BM P, VEC] (lane fastest), each column then reshaped to
    [BM, P].  Loaded as [BM, P, VEC], Triton 3.6's coalescing puts the rows fastest over the threads
    (its stable sort of equal contiguities keeps dim 0 first; 3.9 does not), the lanes' [BM, P]
    layout puts the lanes fastest, and every column of choices and sorted values then takes a
    shuffle to change layout (SASS for sm_90: 43-66 more shuffles a thread).  Flat, both agree.
    ``BF16_PAIRS`` (bf16 logits): converted to f32 by ``_bf16_pairs_to_f32``.
    """
    NEG: tl.constexpr = float("-inf")
    NCH: tl.constexpr = SP // VEC
    SPLIT_WRITE: tl.constexpr = SHORT_CHAIN and TOP4 and SP <= 32  # see the docstring
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    lane = tl.arange(0, P)[None, :]  # [1, P]
    # Row flags: under the 64-register cap (<= 32 logits a lane) in the lanes' [BM, P] layout
    # from the start, so the padding flag is loaded once (a [BM] flag is loaded again for each
    # layout it meets; H200, DeepSeek-V3, nothing padded: mask +1.9-4.7 % -> -1.2-+4.0 %).
    # With more logits a lane per-lane flags cost registers, hence blocks a SM (Kimi-style
    # 32768 tokens: +7.5 % instead of +2.0 %): [BM, 1] there.  benchmarks/RESULTS.md.
    if SP <= 32:
        rr = rows[:, None] + 0 * lane  # [BM, P]
    else:
        rr = rows[:, None]  # [BM, 1]
    if FLAT:  # a flat lane-fastest index, [1, BM P, 1] (see the docstring)
        fi = tl.arange(0, BLOCK_M * P)[None, :, None]
        frow = pid * BLOCK_M + fi // P
    if FLAT and SP <= 32:  # the row flags flat, [BM, P] by a reshape (free; the other way round is not)
        ok_f = frow < T
        lm = ok_f
        pad_f = ok_f & False
        if HAS_PAD:
            pad_f = tl.load(pad_ptr + frow.to(tl.int64) * pad_stride, mask=ok_f, other=0) != 0
            if SKIP_PADDED_LOADS:
                lm = ok_f & (pad_f == 0)
        row_ok = tl.reshape(ok_f, [BLOCK_M, P])
        pad = tl.reshape(pad_f, [BLOCK_M, P])
    else:
        row_ok = rr < T
        live = row_ok
        pad = row_ok & False  # no mask: no row is padded
        if HAS_PAD:
            pad = tl.load(pad_ptr + rr.to(tl.int64) * pad_stride, mask=row_ok, other=0) != 0
            if SKIP_PADDED_LOADS:
                live = row_ok & (pad == 0)
        if FLAT:
            lm = _flat(live, BLOCK_M, P)
        else:
            lm = live[:, :, None]
    vv = tl.arange(0, VEC)[None, None, :]
    e_lane = lane * SP  # first expert of each lane
    rows64 = rows.to(tl.int64)[:, None]
    if FLAT:  # offsets from the flat index, whose divisibility Triton's analysis follows (through a
        # reshape it does not: 2-byte loads)
        e_flat = (fi % P) * SP
        rowp = logits_ptr + frow.to(tl.int64) * stride_t + e_flat + vv
        bp = bias_ptr + e_flat + vv
    else:
        rowp = logits_ptr + rows64[:, :, None] * stride_t + e_lane[:, :, None] + vv  # [BM, P, VEC]
        # the bias as [BM, P, VEC] too (rows re-read it from L1): a [1, P, VEC] load gets another
        # layout and a shared-memory conversion per chunk
        bp = bias_ptr + (e_lane[:, :, None] + vv + 0 * rows[:, None, None])

    xs = _lane_logits(rowp, lm, VEC, NCH)  # every load first: NCH 16-byte loads in flight per lane
    if HAS_PAD and not SKIP_PADDED_LOADS and EARLY_FLAG:
        # the flag's first use beside the first logits' (a padded row's chunk zeroed: its
        # output is (-1, 0) anyway): else ptxas sinks the flag's load to its first use after
        # the routing, and its latency adds to the block's
        if FLAT:
            pad3 = _flat(pad, BLOCK_M, P)
        else:
            pad3 = pad[:, :, None]
        xs = (tl.where(pad3, tl.zeros_like(xs[0]), xs[0]),) + xs[1:]
    cv = _chunk_choices(xs, bp, BLOCK_M, P, VEC, NCH, HAS_BIAS, FAST_SIGMOID, FLAT, BF16_PAIRS)
    if TOP4:  # each lane's 4 best only; the 8 best when a row needs them (below)
        Lt = _top_sorted(cv, SP, 4)
    else:
        Lt = _top_sorted(cv, SP, 8)

    if G > TOPK_GROUP:  # a group = LG neighbouring lanes (LG = 1: lane = group)
        LG: tl.constexpr = P // G
        if SHORT_CHAIN:
            keep = _group_keep(Lt[0], Lt[1], lane, BLOCK_M, P, G, TOPK_GROUP, HAS_BIAS)
        else:
            if LG == 1:
                a1, a2 = Lt[0], Lt[1]
                gid = lane
            else:  # the group's two best: a top-2 reduction over its lanes' heads
                a1, a2 = tl.reduce((tl.reshape(Lt[0], [BLOCK_M, G, LG]), tl.reshape(Lt[1], [BLOCK_M, G, LG])),
                                   2, _top2)
                gid = tl.arange(0, G)[None, :]
            if HAS_BIAS:
                r = a1 + a2
            else:
                r = a1
            keep = tl.zeros([BLOCK_M, G], dtype=tl.int1)
            for _ in tl.static_range(TOPK_GROUP):
                rmax = tl.max(r, axis=1)
                gi = tl.min(tl.where(r == rmax[:, None], gid, G), axis=1)
                hit = gid == gi[:, None]
                keep = keep | hit
                r = tl.where(hit, NEG, r)
            if LG > 1:
                keep = tl.reshape(tl.broadcast_to(keep[:, :, None], [BLOCK_M, G, LG]), [BLOCK_M, P])
        Lt = _kept(Lt, keep)
    else:
        keep = tl.full([BLOCK_M, P], 1, tl.int1)
    ok_st = row_ok
    if HAS_PAD:
        if PAD_RELOAD:  # the flag again (an L1 hit) instead of kept live across the routing; the
            # cache modifier keeps LLVM from merging the two loads (a plain reload is merged)
            pad = tl.load(pad_ptr + rr.to(tl.int64) * pad_stride, mask=row_ok, other=0, cache_modifier=".ca") != 0
        ok_st = ok_st & (pad == 0)
    # the lane's taken experts as bits (m0: 32 or 64 of them)
    if SP > 32:
        m0 = tl.zeros([BLOCK_M, P], tl.int64)
    else:
        m0 = tl.zeros([BLOCK_M, P], tl.int32)
    if SHORT_CHAIN:
        # a row's values >= thr are its taken experts when there are exactly TOPK of them (no
        # tie across its threshold): count them; only a block where some routed row has more
        # counts each lane's values above and at thr and takes the ties lowest id first
        # with TOP4, thr4 = the 8th best of the union of the lanes' 4 best: <= thr, and == thr (no
        # tie across it either) exactly when a row has TOPK values >= thr4, as checked below;
        # else (a lane holds more than 4 of the row's 8 best, or a tie) the 8 best a lane
        tk = _lanes_thr(Lt, keep, lane, BLOCK_M, P, PAIRS)
        m = _bits(cv, tk, m0, SP, BY_WORDS=True)
        n_take = _popc(m, FAST_SIGMOID, SP)
        exact = (tl.sum(n_take, axis=1)[:, None] == TOPK) | (ok_st == 0)
        if tl.min(tl.reshape(exact.to(tl.int32), [BLOCK_M * exact.shape[1]]), axis=0) == 0:
            if TOP4:  # the choices again (kept live, they cost spills), the 8 best a lane, thr
                c8 = _lane_choices(rowp, bp, lm, BLOCK_M, P, VEC, NCH, HAS_BIAS, FAST_SIGMOID, FLAT, BF16_PAIRS)
                tk = _lanes_thr(_kept(_top_sorted(c8, SP, 8), keep), keep, lane, BLOCK_M, P, True)
                m = _bits(c8, tk, m0, SP, BY_WORDS=True)
                n_take = _popc(m, FAST_SIGMOID, SP)
            else:
                c8 = cv
            # the ties at thr, lowest id first (a no-op for a row with exactly TOPK values >= thr)
            m_eq = _bits(c8, tk, m0, SP, EQ=True, BY_WORDS=True)
            n_eq = _popc(m_eq, FAST_SIGMOID, SP)
            n_gt = n_take - n_eq
            need = TOPK - tl.sum(n_gt, axis=1)[:, None]
            take_eq = tl.minimum(tl.maximum(need - (tl.cumsum(n_eq, axis=1) - n_eq), 0), n_eq)
            m = (m ^ m_eq) | _lowest_bits(m_eq, take_eq, TOPK)
            n_take = n_gt + take_eq
            if SPLIT_WRITE:
                _slots_write(logits_ptr, w_out_ptr, ids_out_ptr, rows64, stride_t, lane, m,
                             tl.cumsum(n_take, axis=1) - n_take, scale, ok_st, row_ok, pad, FAST_SIGMOID, BLOCK_M,
                             P, SP, TOPK, RENORM, TOPK, FLAT)
        else:
            if SPLIT_WRITE:  # a routed row's lane takes at most 4: 5 >= thr4 would make 9 in the row
                _slots_write(logits_ptr, w_out_ptr, ids_out_ptr, rows64, stride_t, lane, m,
                             tl.cumsum(n_take, axis=1) - n_take, scale, ok_st, row_ok, pad, FAST_SIGMOID, BLOCK_M,
                             P, SP, TOPK, RENORM, 4, FLAT)
        off = tl.cumsum(n_take, axis=1) - n_take  # first output slot of each lane
    else:
        t2, n_gt, n_eq, take_eq, off = _union_slots(Lt, BLOCK_M, TOPK, True)
        n_take = n_gt + take_eq
        # all the lane's values >= thr, unless it takes only part of its ties (or may hold
        # more ties than its list shows): then count them, lowest id first
        tl_ = tl.where(keep, t2, float("inf"))
        exact = (take_eq == n_eq) & ((n_gt + n_eq < TOPK) | (n_eq == 0))
        if tl.min(tl.min(exact.to(tl.int32), axis=1), axis=0) == 1:
            m = _bits(cv, tl_, m0, SP)
        else:
            m = _bits_ties(cv, tl_, take_eq, m0, SP)

    # Lane s writes slot s where a lane holds <= 32 logits (H200, DeepSeek-V3 32768 tokens: fp32
    # 22.1 -> 20.3 us, bf16 16.6 -> 15.2).  With 48 (Kimi-style, 8 lanes: no group dropped, a
    # lane takes ~1 expert, so the pop loop below runs ~2 rounds) it measured slower: fp32
    # 32768 25.2 -> 27.7 us.  benchmarks/RESULTS.md.
    if SP <= 32:
        if not SPLIT_WRITE:
            _slots_write(logits_ptr, w_out_ptr, ids_out_ptr, rows64, stride_t, lane, m, off, scale, ok_st,
                         row_ok, pad, FAST_SIGMOID, BLOCK_M, P, SP, TOPK, RENORM, TOPK, FLAT)
    else:
        ok2 = ok_st & keep
        obase = rows64 * TOPK
        wsum = tl.zeros([BLOCK_M, P], tl.float32)
        nmax = tl.max(tl.max(tl.where(ok2, n_take, 0), axis=1), axis=0)
        for it in range(0, nmax):  # pop the lowest set bit: ascending id within the lane
            low = m & (-m)
            act = (m != 0) & ok2
            m = m ^ low
            j = ((low.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
            eid = e_lane + j
            x = tl.load(logits_ptr + rows64 * stride_t + eid, mask=act, other=0.0).to(tl.float32)
            s = _sigmoid_rows(x, FAST_SIGMOID)
            if not RENORM:
                s = s * scale
            tl.store(ids_out_ptr + obase + off + it, eid, mask=act)
            tl.store(w_out_ptr + obase + off + it, s, mask=act)
            if RENORM:
                wsum += tl.where(act, s, 0.0)
        _lanes_finish(w_out_ptr, ids_out_ptr, obase, lane, wsum, scale, ok_st, row_ok, pad, BLOCK_M, P, TOPK,
                      RENORM, HAS_PAD)
