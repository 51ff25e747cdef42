"""For "regs": a lane's taken experts as a bit mask, and the writes of a row's output slots
from the lanes' masks.
"""
import triton
import triton.language as tl

from vllm_padplugin.kernels.grouped_topk.networks import _sigmoid_rows


@triton.jit
def _bits_word(cv, t, J0: tl.constexpr, N: tl.constexpr, EQ: tl.constexpr):
    """int32 with bit j - J0 set for each ``cv[j]`` >= ``t`` (== with ``EQ``), j in [J0, J0 + N):
    a select of ``m | bit`` a value (ptxas: a compare and a predicated add; ``m | (c << j)``
    takes ~3 instructions a value), into four partial masks so the ORs do not form one
    dependent chain."""
    w = tl.zeros_like(t).to(tl.int32)
    for q in tl.static_range(4):
        a = tl.zeros_like(w)
        for j in tl.static_range(q, N, 4):
            bit = (1 << j) - ((1 << j) >> 31 << 32)  # bit j as a signed int32 (j = 31: -2**31)
            if EQ:
                a = tl.where(cv[J0 + j] == t, a | bit, a)
            else:
                a = tl.where(cv[J0 + j] >= t, a | bit, a)
        w = w | a
    return w


@triton.jit
def _bits(cv, t, m, SP: tl.constexpr, EQ: tl.constexpr = False, BY_WORDS: tl.constexpr = False):
    """``m`` | bit j for each of the lane's choices ``cv[j]`` >= ``t`` (== with ``EQ``);
    ``BY_WORDS``: 32 bits at a time by ``_bits_word`` (fewer instructions; the served build
    keeps its own lowering)."""
    if BY_WORDS:
        if SP <= 32:
            return m | _bits_word(cv, t, 0, SP, EQ)
        else:
            lo = _bits_word(cv, t, 0, 32, EQ).to(tl.int64) & 0xFFFFFFFF
            return m | lo | (_bits_word(cv, t, 32, SP - 32, EQ).to(tl.int64) << 32)
    else:
        for j in tl.static_range(SP):
            if EQ:
                m = m | ((cv[j] == t).to(m.dtype) << j)
            else:
                m = m | ((cv[j] >= t).to(m.dtype) << j)
        return m


@triton.jit
def _bits_ties(cv, t, take_eq, m, SP: tl.constexpr):
    """``m`` | bit j for each choice > ``t`` and for the lane's first ``take_eq`` equal to it."""
    neq = tl.zeros_like(take_eq)
    for j in tl.static_range(SP):
        eq = cv[j] == t
        take = (cv[j] > t) | (eq & (neq < take_eq))
        neq += eq.to(tl.int32)
        m = m | (take.to(m.dtype) << j)
    return m


@triton.jit
def _lowest_bits(x, k, KMAX: tl.constexpr):
    """The ``k`` (<= KMAX) lowest set bits of ``x``."""
    r = tl.zeros_like(x)
    for i in tl.static_range(KMAX):
        low = x & (-x)
        r = r | tl.where(i < k, low, 0)
        x = x ^ low
    return r


@triton.jit
def _popc(m, FAST: tl.constexpr, SP: tl.constexpr):
    """Set bits of each lane's mask (int32, or int64 above 32 logits a lane), as int32.  The
    CPU interpreter cannot run PTX: a count bit by bit there."""
    if FAST:
        if SP > 32:
            return tl.inline_asm_elementwise("popc.b64 $0, $1;", "=r,l", [m], dtype=tl.int32, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [m], dtype=tl.int32, is_pure=True, pack=1)
    else:
        n = tl.zeros_like(m).to(tl.int32)
        for j in tl.static_range(SP):
            n += ((m >> j) & 1).to(tl.int32)
        return n


@triton.jit
def _slots_write(logits_ptr, w_out_ptr, ids_out_ptr, rows64, stride_t, lane, m, off, scale, ok_st, row_ok, pad,
                 FAST: tl.constexpr, BM: tl.constexpr, P: tl.constexpr, SP: tl.constexpr, TOPK: tl.constexpr,
                 RENORM: tl.constexpr, JMAX: tl.constexpr, FLAT: tl.constexpr = False):
    """Lane s writes output slot s (s, s + P, .. when P < TOPK): the lanes' taken experts
    (bit masks ``m``) fill slots [off, off + its count) in ascending id, so slot s belongs
    to the last lane whose ``off`` <= s (``off`` is non-decreasing: a binary search over
    the lanes by ``tl.gather``, a warp shuffle) and is that lane's (s - off)-th taken bit.
    One logit reload a slot, all slots of a row at once, the weight sum by a shuffle
    reduction: no loop whose trip count is the busiest lane's, no barrier and no reload of
    written weights.  Padded rows get (-1, 0) from the same stores.  ``JMAX``: the most
    experts a routed row's lane takes (one dependent bit drop per taken expert but the last).
    ``FLAT``: the reload as one [BM P] vector (the kernel's ``FLAT``: else Triton 3.6 gives it the
    rows-fastest layout, a shuffle for its pointer and one for its value)."""
    LOG_P: tl.constexpr = P.bit_length() - 1
    NS: tl.constexpr = (TOPK + P - 1) // P  # slots a lane
    ws = ()
    eids = ()
    wsum = tl.zeros([BM], tl.float32)
    for k in tl.static_range(NS):
        slot = k * P + lane
        q = tl.zeros_like(off)
        oq = tl.zeros_like(off)
        for b in tl.static_range(LOG_P):
            cand = q + (P >> (b + 1))
            oc = tl.gather(off, cand, 1)
            up = oc <= slot
            q = tl.where(up, cand, q)
            oq = tl.where(up, oc, oq)
        mq = tl.gather(m, q, 1)
        j = slot - oq
        for i in tl.static_range(JMAX - 1):  # drop the j lowest taken bits
            mq = tl.where(j > i, mq & (mq - 1), mq)
        low = mq & (-mq)
        bit = ((low.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        eid = q * SP + bit
        act = ok_st & (slot < TOPK)
        if FLAT:
            x = tl.reshape(tl.load(tl.reshape(logits_ptr + rows64 * stride_t + eid, [BM * P]),
                                   mask=tl.reshape(act, [BM * P]), other=0.0), [BM, P]).to(tl.float32)
        else:
            x = tl.load(logits_ptr + rows64 * stride_t + eid, mask=act, other=0.0).to(tl.float32)
        s = tl.where(act, _sigmoid_rows(x, FAST), 0.0)
        wsum += tl.sum(s, axis=1)
        ws = ws + (s,)
        eids = eids + (eid,)
    if RENORM:
        f = (scale / wsum)[:, None]
    else:
        f = scale
    for k in tl.static_range(NS):
        slot = k * P + lane
        sm = row_ok & (slot < TOPK)
        tl.store(ids_out_ptr + rows64 * TOPK + slot, tl.where(pad, -1, eids[k]), mask=sm)
        tl.store(w_out_ptr + rows64 * TOPK + slot, tl.where(pad, 0.0, ws[k] * f), mask=sm)
