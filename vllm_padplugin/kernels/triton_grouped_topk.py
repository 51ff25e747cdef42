"""Fused grouped top-k routing with the padding mask, in one Triton launch.

The torch composite (:mod:`.reference`) takes ~15 launches per MoE layer.  Three kernels
compute the same routing; ``default_config`` picks one per batch size (H200 sweep,
benchmarks/RESULTS.md):

* ``tile`` (small batches): one warp per token on a flat [BLOCK_M, E] tile, value-only
  top-k passes with an exact lowest-id path for tiles with a tie, prefix-sum writes.
  Shortest chain per token, so it wins while the batch is latency-bound.
* ``parts`` (>= 4096 tokens where ``regs`` does not apply): P lanes per token (one per
  group when groups are dropped, else 8 slices), each lane's experts in its own registers,
  16-byte loads (bf16 converted in-register).  A lane ranks its group (two best biased scores); the ``topk_group`` best
  groups (lowest id on ties) are spread over all lanes; each lane keeps its ``topk`` best
  values sorted (per chunk: sort, bitonic merge); ``thr`` = the k-th value of the union
  (``topk`` pops of the lanes' heads); a lane takes its values > ``thr`` and its share of
  the ties at ``thr`` (lowest ids first) and writes them at slots from an exclusive scan
  over the lanes.  ~3x fewer instructions per token than ``tile``.
* ``regs`` (wherever it applies; H200: faster than ``parts`` and ``tile`` at every timed size):
  P lanes per token whose logits stay in registers: each read and put through the sigmoid
  once (``parts`` recomputes the kept experts' twice), a group's rank from the lane's
  sorted top-8, a butterfly merge of the lanes' lists (``tl.reduce``), each lane's taken
  experts as a bit mask, then lane s writes output slot s (or, 48 logits a lane, each lane its
  own, popping the mask).  ``topk`` = 8 only.
  ~275 warp instructions per token for DeepSeek-V3 fp32 against ``parts``' ~350 (SASS).
  With 16 or 32 lanes per token (a group then spans neighbouring lanes, its rank a top-2
  reduction over them) a thread holds fewer logits, so a token's chain is shorter: 32 lanes
  serve small DeepSeek-V3 batches (latency-bound; H200: <= 2.7 us at <= 256 tokens), 16 lanes
  Kimi-style at every size and fp32 DeepSeek-V3 from 1024 tokens on (H100: 3-10 % faster than 8
  lanes at >= 4096 tokens); 8 lanes stay for 16-bit DeepSeek-V3 logits from 4096 tokens on.
  From 16384 tokens fp32 DeepSeek-V3 and 16-bit Kimi-style lanes sort only their 4 best
  (``top4``; a row whose 8 best crowd into a lane takes a fallback): H200 -2 to -7 %.
* ``rows``: the same with one thread per token (fewest instructions, but too few threads
  to hide latency: slower than ``parts`` everywhere measured; kept selectable).

Common to all: scores = sigmoid(logits); choice = scores + correction bias; a group's rank =
the sum of its two best choices (its best without a bias); the ``topk`` best choices among
the kept groups are selected, ties to the lowest expert id (the reference's definition);
weights = the unbiased scores, renormalised and scaled.  Ids within a row come out in
ascending expert order (vLLM asks torch.topk for ``sorted=False``, whose order is
unspecified).  Padded rows (``is_padding``) get ``(-1, 0)``; with ``skip_padded_loads``
they read no logits at all.  ``rows`` / ``parts`` use the SFU's approximate ex2 / rcp for
the sigmoid (like ``tl.sigmoid``'s ex2.approx + div.full, within a few ulp of torch's).

Falls back to the torch reference when Triton or a CUDA tensor is unavailable.
"""
from __future__ import annotations

import torch

from vllm_padplugin.kernels.reference import grouped_topk_reference
from vllm_padplugin.kernels.triton_mask import HAS_TRITON, _interpreting, can_use_triton, triton

if HAS_TRITON:
    import triton.language as tl

    @triton.jit
    def _top2(a1, a2, b1, b2):
        """Combine two (best, second best) pairs; duplicates count twice, like topk(2)."""
        return tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2))

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
    def _merge8(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7):
        """Top 8 of two descending 8-lists, descending: pair a_i with b_(7-i) (a bitonic
        sequence), then half-cleaners at distance 4, 2, 1.  Associative and commutative, so
        ``tl.reduce`` can use it: a butterfly merge of the lanes' lists in 3 shuffle rounds."""
        return _bitonic_sort((tl.maximum(a0, b7), tl.maximum(a1, b6), tl.maximum(a2, b5), tl.maximum(a3, b4),
                              tl.maximum(a4, b3), tl.maximum(a5, b2), tl.maximum(a6, b1), tl.maximum(a7, b0)), 8, 3)

    @triton.jit
    def _chunk_choices(xs, bp, BM: tl.constexpr, P: tl.constexpr, VEC: tl.constexpr, NCH: tl.constexpr,
                       HAS_BIAS: tl.constexpr, FAST: tl.constexpr):
        """A lane's choices (sigmoid + bias) from its NCH loaded chunks of logits ``xs``, as a
        tuple of NCH x VEC [BM, P] columns in ascending expert id."""
        cv = ()
        for ci in tl.static_range(NCH):
            xv = _sigmoid_rows(xs[ci].to(tl.float32), FAST)
            if HAS_BIAS:
                xv = xv + tl.load(bp + ci * VEC).to(tl.float32)
            cv = cv + _split_lanes(xv, BM, P, VEC)
        return cv

    @triton.jit
    def _lane_logits(rowp, lm, VEC: tl.constexpr, NCH: tl.constexpr):
        """A lane's NCH 16-byte chunks of logits, every load issued before any is used."""
        xs = ()
        for ci in tl.static_range(NCH):
            xs = xs + (tl.load(rowp + ci * VEC, mask=lm, other=0.0),)
        return xs

    @triton.jit
    def _lane_choices(rowp, bp, lm, BM: tl.constexpr, P: tl.constexpr, VEC: tl.constexpr, NCH: tl.constexpr,
                      HAS_BIAS: tl.constexpr, FAST: tl.constexpr):
        """``_chunk_choices`` of the lane's logits loaded again (from cache)."""
        return _chunk_choices(_lane_logits(rowp, lm, VEC, NCH), bp, BM, P, VEC, NCH, HAS_BIAS, FAST)

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
    def _merge44(c):
        """Two descending 4-lists ``c[0:4]``, ``c[4:8]`` merged into a descending 8: Batcher's
        odd-even merge, 9 compare-exchanges (a bitonic merge takes 12)."""
        x0, x1, x2, x3, x4, x5, x6, x7 = c
        x0, x4 = _ce(x0, x4)
        x2, x6 = _ce(x2, x6)
        x1, x5 = _ce(x1, x5)
        x3, x7 = _ce(x3, x7)
        x2, x4 = _ce(x2, x4)
        x3, x5 = _ce(x3, x5)
        x1, x2 = _ce(x1, x2)
        x3, x4 = _ce(x3, x4)
        x5, x6 = _ce(x5, x6)
        return (x0, x1, x2, x3, x4, x5, x6, x7)

    @triton.jit
    def _union_top8(L4, lane, BM: tl.constexpr, P: tl.constexpr, OEM: tl.constexpr = False):
        """The 8 best of the union of the P lanes' sorted top-4 lists ``L4`` (4 [BM, P] columns),
        descending, in every lane: a butterfly whose first round merges two 4-lists into a sorted
        8 (bitonic, 12 compare-exchanges; ``OEM``: odd-even, 9), the others ``_merge8``."""
        ln = tl.broadcast_to(lane, [BM, P])
        o = ln ^ 1
        if OEM:
            c = _merge44((L4[0], L4[1], L4[2], L4[3], tl.gather(L4[0], o, 1), tl.gather(L4[1], o, 1),
                          tl.gather(L4[2], o, 1), tl.gather(L4[3], o, 1)))
        else:
            c = (L4[0], L4[1], L4[2], L4[3], tl.gather(L4[3], o, 1), tl.gather(L4[2], o, 1), tl.gather(L4[1], o, 1),
                 tl.gather(L4[0], o, 1))  # a descending 4 then an ascending one: bitonic
            c = _bitonic_sort(c, 8, 3)
        for b in tl.static_range(1, P.bit_length() - 1):
            o = ln ^ (1 << b)
            c = _merge8(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
                        tl.gather(c[0], o, 1), tl.gather(c[1], o, 1), tl.gather(c[2], o, 1), tl.gather(c[3], o, 1),
                        tl.gather(c[4], o, 1), tl.gather(c[5], o, 1), tl.gather(c[6], o, 1), tl.gather(c[7], o, 1))
        return c

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
    def _lanes_thr(L, keep, lane, BM: tl.constexpr, P: tl.constexpr, PAIRS: tl.constexpr, OEM: tl.constexpr):
        """The 8th best of the union of the lanes' descending lists ``L`` (4 or 8 [BM, P] columns);
        +inf in the lanes of dropped groups (``keep`` false), which take nothing.  ``PAIRS``:
        ``_pair_thr8``; else a butterfly (4-lists: ``_union_top8``; 8-lists: ``tl.reduce`` with
        ``_merge8``)."""
        if PAIRS:
            t = _pair_thr8(L, lane, BM, P)
        elif len(L) == 4:
            t = _union_top8(L, lane, BM, P, OEM)[7]
        else:
            t = tl.reduce(L, 1, _merge8)[7][:, None]
        return tl.where(keep, t, float("inf"))

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

    @triton.jit
    def _slots_write(logits_ptr, w_out_ptr, ids_out_ptr, rows64, stride_t, lane, m, off, scale, ok_st, row_ok, pad,
                     FAST: tl.constexpr, BM: tl.constexpr, P: tl.constexpr, SP: tl.constexpr, TOPK: tl.constexpr,
                     RENORM: tl.constexpr, JMAX: tl.constexpr):
        """Lane s writes output slot s (s, s + P, .. when P < TOPK): the lanes' taken experts
        (bit masks ``m``) fill slots [off, off + its count) in ascending id, so slot s belongs
        to the last lane whose ``off`` <= s (``off`` is non-decreasing: a binary search over
        the lanes by ``tl.gather``, a warp shuffle) and is that lane's (s - off)-th taken bit.
        One logit reload a slot, all slots of a row at once, the weight sum by a shuffle
        reduction: no loop whose trip count is the busiest lane's, no barrier and no reload of
        written weights.  Padded rows get (-1, 0) from the same stores.  ``JMAX``: the most
        experts a routed row's lane takes (one dependent bit drop per taken expert but the last)."""
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
        OEM: tl.constexpr = False,
        SPLIT_WRITE: tl.constexpr = False,
        PAIRS: tl.constexpr = False,
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
        ``TOPK`` values >= thr.
        """
        NEG: tl.constexpr = float("-inf")
        NCH: tl.constexpr = SP // VEC
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
        row_ok = rr < T
        live = row_ok
        pad = row_ok & False  # no mask: no row is padded
        if HAS_PAD:
            pad = tl.load(pad_ptr + rr.to(tl.int64) * pad_stride, mask=row_ok, other=0) != 0
            if SKIP_PADDED_LOADS:
                live = row_ok & (pad == 0)
        vv = tl.arange(0, VEC)[None, None, :]
        e_lane = lane * SP  # first expert of each lane
        rows64 = rows.to(tl.int64)[:, None]
        rowp = logits_ptr + rows64[:, :, None] * stride_t + e_lane[:, :, None] + vv  # [BM, P, VEC]
        # the bias as [BM, P, VEC] too (rows re-read it from L1): a [1, P, VEC] load gets another
        # layout and a shared-memory conversion per chunk
        bp = bias_ptr + (e_lane[:, :, None] + vv + 0 * rows[:, None, None])
        lm = live[:, :, None]

        xs = _lane_logits(rowp, lm, VEC, NCH)  # every load first: NCH 16-byte loads in flight per lane
        if HAS_PAD and not SKIP_PADDED_LOADS and EARLY_FLAG:
            # the flag's first use beside the first logits' (a padded row's chunk zeroed: its
            # output is (-1, 0) anyway): else ptxas sinks the flag's load to its first use after
            # the routing, and its latency adds to the block's
            xs = (tl.where(pad[:, :, None], tl.zeros_like(xs[0]), xs[0]),) + xs[1:]
        cv = _chunk_choices(xs, bp, BLOCK_M, P, VEC, NCH, HAS_BIAS, FAST_SIGMOID)
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
            tk = _lanes_thr(Lt, keep, lane, BLOCK_M, P, PAIRS, OEM)
            m = _bits(cv, tk, m0, SP, BY_WORDS=True)
            n_take = _popc(m, FAST_SIGMOID, SP)
            exact = (tl.sum(n_take, axis=1)[:, None] == TOPK) | (ok_st == 0)
            if tl.min(tl.reshape(exact.to(tl.int32), [BLOCK_M * exact.shape[1]]), axis=0) == 0:
                if TOP4:  # the choices again (kept live, they cost spills), the 8 best a lane, thr
                    c8 = _lane_choices(rowp, bp, lm, BLOCK_M, P, VEC, NCH, HAS_BIAS, FAST_SIGMOID)
                    tk = _lanes_thr(_kept(_top_sorted(c8, SP, 8), keep), keep, lane, BLOCK_M, P, PAIRS, OEM)
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
                                 P, SP, TOPK, RENORM, TOPK)
            else:
                if SPLIT_WRITE:  # a routed row's lane takes at most 4: 5 >= thr4 would make 9 in the row
                    _slots_write(logits_ptr, w_out_ptr, ids_out_ptr, rows64, stride_t, lane, m,
                                 tl.cumsum(n_take, axis=1) - n_take, scale, ok_st, row_ok, pad, FAST_SIGMOID, BLOCK_M,
                                 P, SP, TOPK, RENORM, 4)
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
                             row_ok, pad, FAST_SIGMOID, BLOCK_M, P, SP, TOPK, RENORM, TOPK)
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

# (kernel, BLOCK_M, num_warps) per batch size; key = the smallest batch size an entry is
# for.  From the H200 sweeps (benchmarks/gpu_masking.py --tune): "tile" with one token per
# one-warp program wins up to 1024 tokens, "parts" with one warp (4 tokens x 8 lanes) from
# 4096 on (results/gpu_masking_h200_final.json; 1025-4095 tokens not measured, stay "tile").
# Routers that drop groups (DeepSeek-V3) where "regs" applies: "regs" with one warp, fp32 and
# bf16 (results/gpu_masking_h200_regs.json: 4.23 vs tile's 4.38 us at 1024 fp32, 22.1 vs parts'
# 29.8 us at 32768; below 4096 tokens with more lanes, see the note at the tables).  Routers that keep every group (Kimi-style): "regs"
# at every size (results/gpu_masking_h200_regs_kimi.json: 3.03 vs tile's 3.14 us at 16 tokens
# fp32, 25.9 vs parts' 39.5 at 32768).
# Registers per thread for "regs" by logits a lane (up to): ptxas for sm_90 spills nothing
# under the cap (benchmarks/profile_grouped_topk.py --sass), and without it the mask takes
# DeepSeek-V3 to 68: 28 instead of 32 blocks per SM (H200 ncu, issue 11).  Kimi-style (48 a
# lane, 84 with the mask) capped at 80 measured slower, masked or not (gpu_masking_h200_kimicap).
_REGS_MAXNREG = ((32, 64),)


def _regs_cap(logits_per_lane: int) -> dict:
    """The launch option that caps "regs"' registers (``{}``: the compiler's choice)."""
    return next(({"maxnreg": r} for n, r in _REGS_MAXNREG if logits_per_lane <= n), {})


_CONFIGS: dict[int, tuple[str, int, int]] = {0: ("tile", 1, 1), 4096: ("parts", 4, 1)}
# "regs" with more lanes per token below 4096 tokens (H200, results/gpu_masking_h200_lanes.*): BLOCK_M 1
# = 32 lanes (DeepSeek-V3: 2.61-2.77 us at <= 256 tokens against tile's 3.13-3.37), 2 = 16 lanes
# (DeepSeek-V3 at 1024; Kimi-style up to 4096: 2.48-2.77 us at <= 256 against 8 lanes' 3.01-3.22).
# From 4096 tokens 16 lanes also won over 8 for fp32 logits (DeepSeek-V3 -2.7 / -6.7 / -10.1 % at
# 4096 / 16384 / 32768) and for Kimi-style at both dtypes (fp32 -19.1 / -14.1 %, bf16 -11.5 / -5.4 %
# at 16384 / 32768), not for DeepSeek-V3 bf16 (+6 to +24 %): H100, results/kernel_ab_h100_lanes16.*.
_CONFIGS_REGS: dict[int, tuple[str, int, int]] = {0: ("regs", 1, 1), 1024: ("regs", 2, 1)}
_CONFIGS_REGS_BF16: dict[int, tuple[str, int, int]] = {0: ("regs", 1, 1), 1024: ("regs", 2, 1), 4096: ("regs", 4, 1)}
_CONFIGS_REGS_NO_DROP: dict[int, tuple[str, int, int]] = {0: ("regs", 2, 1)}


def short_chain_served(num_tokens: int, drops_groups: bool) -> bool:
    """Whether the served "regs" build is ``short_chain``: where it beat the long chain
    (benchmarks/kernel_ab.py: median < -1 %, 90th percentile < 0, A/A within 1 %).  Routers that
    drop groups (DeepSeek-V3): every size (H200, results/kernel_ab_h200.*: -5 to -16 %).  Routers
    that keep every group (Kimi-style, 16 lanes a token at every size): above 1024 tokens (H100,
    results/kernel_ab_h100_kimi_mid.*, kernel_ab_h100_lanes16_served.*: -2 to -10 %); at <= 1024
    tokens it lost 1-2 % (H200 and H100).  Both dtypes alike since 16 lanes serve Kimi-style
    above 4096 tokens (with 8 lanes there, fp32 was even)."""
    return drops_groups or num_tokens > 1024


def early_flag_served(drops_groups: bool) -> bool:
    """Whether "regs" issues the padding flag's load with the logits' (``EARLY_FLAG``; it acts
    where padded rows load their logits, by default up to 1024 tokens): where it won on the H100
    (benchmarks/mask_cost.py, results/mask_cost_h100_early_flag.*: the mask with nothing padded
    from +1.3-6.0 % to -0.0-+2.8 % at <= 1024 tokens).  Routers that drop groups (DeepSeek-V3):
    yes.  Routers that keep every group (Kimi-style): no (+1.1 to +1.9 points at 16 / 64 tokens)."""
    return drops_groups


def top4_served(num_tokens: int, drops_groups: bool, itemsize: int) -> bool:
    """Whether the served short-chain "regs" build keeps each lane's 4 best choices (``TOP4``)
    instead of 8: where it beat 8 on the H200 (benchmarks/kernel_ab.py, results/kernel_ab_h200_top4*:
    median < -1 %, 90th percentile < 0, A/A within 0.4 %), from 16384 tokens for fp32 DeepSeek-V3
    (-4.3 to -4.5 %) and 16-bit Kimi-style (-2.4 to -6.7 %).  Elsewhere it lost: more rows need
    the fallback (a lane holding more than 4 of a row's 8 best), bf16 DeepSeek-V3 with 32 logits
    a lane +3 to +29 %, fp32 Kimi-style +3 to +10 %; at <= 8192 tokens it was even or lost."""
    return num_tokens >= 16384 and (itemsize == 4) == drops_groups


def default_config(num_tokens: int, num_experts: int, dtype: torch.dtype | None = None, *,
                   num_expert_group: int = 1, topk_group: int = 1, topk: int = 8) -> tuple[str, int, int]:
    """(kernel, BLOCK_M, num_warps) for a batch: the entry for the largest key <= T of
    ``_CONFIGS_REGS`` (``_BF16`` for 16-bit logits) / ``_CONFIGS_REGS_NO_DROP`` (where "regs"
    applies: groups dropped / not) or ``_CONFIGS``."""
    vec = 16 // (dtype.itemsize if dtype is not None else 4)
    table = _CONFIGS
    if _regs_lanes(num_experts, num_expert_group, topk_group, topk, vec):
        table = _CONFIGS_REGS_NO_DROP
        if num_expert_group > topk_group:
            table = _CONFIGS_REGS_BF16 if vec == 8 else _CONFIGS_REGS
    key = max(k for k in table if k <= max(num_tokens, 0))
    return table[key]


def _parts_lanes(num_experts: int, num_expert_group: int, topk_group: int, vec: int) -> int:
    """Lanes per token for the "parts" kernel (0: it does not apply): one per group when
    groups are dropped (a power of 2 <= 32), else 8 slices of whole 16-byte chunks."""
    if num_expert_group > topk_group:
        g = num_expert_group
        ok = g & (g - 1) == 0 and g <= 32 and (num_experts // g) % vec == 0
        return g if ok else 0
    return 8 if num_experts % (8 * vec) == 0 else 0


def _regs_lanes(num_experts: int, num_expert_group: int, topk_group: int, topk: int, vec: int,
                lanes: int | None = None) -> int:
    """Lanes per token for the "regs" kernel (0: it does not apply): by default one per group
    when groups are dropped, else 8 slices; ``lanes`` asks for more (a group then spans
    ``lanes / groups`` lanes).  A lane's experts are whole sort chunks of 8 and 16-byte loads,
    at most 64 (its bit mask)."""
    if topk != 8:
        return 0
    p = lanes or (num_expert_group if num_expert_group > topk_group else 8)
    sp = num_experts // p
    ok = (p & (p - 1) == 0 and p <= 32 and num_experts % p == 0 and sp % 8 == 0 and sp % vec == 0 and sp <= 64
          and (num_expert_group <= topk_group or p % num_expert_group == 0))
    return p if ok else 0


def fused_grouped_topk(
    gating_output: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    *,
    topk: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    is_padding: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_m: int | None = None,
    num_warps: int | None = None,
    skip_padded_loads: bool | None = None,
    kernel: str | None = None,
    merge: bool | None = None,
    short_chain: bool | None = None,
    early_flag: bool | None = None,
    top4: bool | None = None,
    odd_even: bool = False,
    split_write: bool = False,
    pair_union: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid grouped top-k + mask in one launch; returns ``(weights f32, ids i32)``.

    ``gating_output``: [T, E] float32 / bfloat16 / float16 logits.
    ``out`` = preallocated ``(weights, ids)`` (contiguous [T, topk]) to write into.
    ``is_padding`` may be longer than the batch; only ``[:T]`` is read.
    ``skip_padded_loads`` (default: above 1024 tokens) makes padded rows skip their logits
    load, which pays when bandwidth-bound and costs a dependent load when latency-bound.
    Ids within a row come in ascending expert order (the set is the reference's).
    ``kernel`` ("tile" / "parts" / "regs" / "rows"), ``block_m`` (tile; for regs the tokens per
    program, i.e. 32 x num_warps / lanes per token) and ``num_warps`` override
    ``default_config``; ``merge`` (rows / parts): sort-and-merge (default where ``topk`` is a
    power of 2 >= the chunk) or insertion for the k best.  "rows" needs the experts per group,
    "parts" those per lane, to be whole 16-byte chunks of logits; else "tile".
    The "regs" variant ``short_chain`` (issue 11; ``benchmarks/kernel_ab.py``) ranks the
    groups with one independent shuffle per other group, and takes each lane's values >= thr
    wherever a row has exactly ``topk`` of them (a population count), counting ties only in a
    block where some row has more (fewer instructions and a shorter dependent chain, the same
    results); default (None): where it won, ``short_chain_served``.
    ``early_flag`` ("regs", where padded rows load their logits): the padding flag's first use
    beside the first logits', so that its load is issued with theirs (ptxas otherwise sinks it to
    its first use after the routing); default (None): where it won, ``early_flag_served``.
    ``top4`` ("regs" with ``short_chain``): each lane sorts its 4 best choices instead of 8; the
    8th best of the lanes' union is the threshold wherever a row then has exactly ``topk``
    choices at or above it, else the block takes each lane's 8 best from its logits loaded
    again (same results); default (None): where it won, ``top4_served``.
    ``odd_even`` ("regs" with ``top4``): the first round of the lanes' union merges two 4-lists by
    Batcher's odd-even merge (9 compare-exchanges instead of 12; same results); an experiment.
    ``split_write`` ("regs" with ``top4``, <= 32 logits a lane): the output written in each branch
    of the block's exactness test, so that the common one knows a lane takes at most 4 experts
    (3 dependent bit drops a slot instead of 7; same results); an experiment.
    ``pair_union`` ("regs" with ``short_chain``): the threshold from the lanes' lists merged with
    a sorted 8 held by two lanes (``_pair_thr8``; same threshold); an experiment.
    """
    tensors = [gating_output] + ([is_padding] if is_padding is not None else [])
    num_tokens, num_experts = gating_output.shape
    per_group = num_experts // max(num_expert_group, 1)
    if not can_use_triton(*tensors) or per_group < 2 or topk > topk_group * per_group:
        w, i = grouped_topk_reference(
            gating_output,
            e_score_correction_bias,
            topk=topk,
            num_expert_group=num_expert_group,
            topk_group=topk_group,
            renormalize=renormalize,
            routed_scaling_factor=routed_scaling_factor,
            is_padding=is_padding,
        )
        if out is not None:
            out[0].copy_(w)
            out[1].copy_(i)
            return out
        return w, i
    if num_experts % num_expert_group:
        raise ValueError(f"{num_experts} experts do not split into {num_expert_group} groups")
    if gating_output.stride(1) != 1:
        gating_output = gating_output.contiguous()
    if out is None:
        weights = torch.empty(num_tokens, topk, dtype=torch.float32, device=gating_output.device)
        ids = torch.empty(num_tokens, topk, dtype=torch.int32, device=gating_output.device)
    else:
        weights, ids = out
    if num_tokens == 0:
        return weights, ids
    kern, bm, nw = default_config(num_tokens, num_experts, gating_output.dtype, num_expert_group=num_expert_group,
                                  topk_group=topk_group, topk=topk)
    if kernel is not None and kernel != kern:
        kern, bm = kernel, (1 if kernel == "tile" else 32)
    nw = num_warps or nw
    vec = 16 // gating_output.element_size()
    lanes = 0
    if kern == "parts":
        lanes = _parts_lanes(num_experts, num_expert_group, topk_group, vec)
    elif kern == "regs":
        # BLOCK_M (a table's, or block_m) = 32 x num_warps / lanes; lanes the router cannot take:
        # its own default
        tokens = block_m or bm
        want = 32 * nw // tokens if tokens < 32 else None
        lanes = (_regs_lanes(num_experts, num_expert_group, topk_group, topk, vec, want)
                 or _regs_lanes(num_experts, num_expert_group, topk_group, topk, vec))
    lpg = 0  # lanes per kept group ("parts" with dropped groups); 0: lanes of dropped groups idle
    if kern == "parts" and lanes and num_expert_group > topk_group and lanes % topk_group == 0:
        lpg = lanes // topk_group if (per_group % (lanes // topk_group) == 0
                                      and (per_group // (lanes // topk_group)) % vec == 0) else 0
    idle_lanes = kern == "parts" and lanes and num_expert_group > topk_group and not lpg
    if ((kern == "rows" and per_group % vec) or (kern in ("parts", "regs") and not lanes)
            or (idle_lanes and kernel is None)):
        # the idle-lane mode of "parts" runs only when asked for: the H200 runs verified the
        # spread mode (DeepSeek-V3) and the no-drop mode (Kimi-style), this one only the interpreter
        kern, bm = "tile", 1
    if kern == "rows":
        bm = 32 * nw
    elif kern in ("parts", "regs"):
        bm = 32 * nw // lanes
    else:
        bm = block_m or bm
    pad = is_padding.view(torch.uint8) if is_padding is not None else gating_output
    bias = e_score_correction_bias if e_score_correction_bias is not None else gating_output
    args = (
        gating_output,
        bias,
        pad,
        weights,
        ids,
        num_tokens,
        gating_output.stride(0),
        is_padding.stride(0) if is_padding is not None else 0,
        float(routed_scaling_factor),
    )
    common = dict(
        G=num_expert_group,
        S=per_group,
        TOPK_GROUP=topk_group,
        TOPK=topk,
        HAS_BIAS=e_score_correction_bias is not None,
        HAS_PAD=is_padding is not None,
        RENORM=renormalize,
        SKIP_PADDED_LOADS=(num_tokens > 1024) if skip_padded_loads is None else skip_padded_loads,
        BLOCK_M=bm,
        BLOCK_K=triton.next_power_of_2(topk),
        num_warps=nw,
    )
    grid = (triton.cdiv(num_tokens, bm),)
    if kern in ("rows", "parts", "regs"):
        pow2 = (topk & (topk - 1)) == 0 and topk >= vec
        merge = pow2 if merge is None else (merge and pow2)
        extra = dict(VEC=vec, FAST_SIGMOID=not _interpreting(), MERGE=merge)
        log_topk = topk.bit_length() - 1
        if kern == "rows":
            _grouped_topk_rows_kernel[grid](*args, LOG_TOPK=log_topk, **extra, **common)
        elif kern == "parts":
            _grouped_topk_parts_kernel[grid](*args, P=lanes, SP=num_experts // lanes, LPG=lpg, LOG_TOPK=log_topk,
                                             **extra, **common)
        else:
            sp = num_experts // lanes
            cap = {}
            if not (_interpreting() or torch.version.hip):  # Triton's HIP backend has no maxnreg
                cap = _regs_cap(sp)
            drops = num_expert_group > topk_group
            if short_chain is None:
                short_chain = short_chain_served(num_tokens, drops)
            if early_flag is None:
                early_flag = early_flag_served(drops)
            if top4 is None:
                top4 = top4_served(num_tokens, drops, gating_output.dtype.itemsize)
            _grouped_topk_regs_kernel[grid](*args, P=lanes, SP=sp, LPG=lpg, SHORT_CHAIN=short_chain,
                                            EARLY_FLAG=bool(early_flag), TOP4=bool(top4 and short_chain),
                                            OEM=bool(odd_even),
                                            SPLIT_WRITE=bool(split_write and top4 and short_chain and sp <= 32),
                                            PAIRS=bool(pair_union and short_chain and lanes >= 4),
                                            **cap,
                                            **extra, **common)
    else:
        _grouped_topk_kernel[grid](
            *args,
            BLOCK_G=triton.next_power_of_2(num_expert_group),
            BLOCK_S=max(4, triton.next_power_of_2(per_group)),
            **common,
        )
    return weights, ids
