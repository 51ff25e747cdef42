"""Fused grouped top-k routing with the padding mask, in one Triton launch.

The torch composite (:mod:`.reference`) takes ~15 launches per MoE layer.  Three kernels
compute the same routing; ``default_config`` picks one per batch size (H200 sweep,
benchmarks/RESULTS.md) and ``fused_grouped_topk`` launches it.  The kernels themselves live in
:mod:`vllm_padplugin.kernels.grouped_topk`, one module each:

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
  From 4096 tokens fp32 DeepSeek-V3 and 16-bit Kimi-style lanes sort only their 4 best
  (``top4``; a row whose 8 best crowd into a lane takes a fallback), the lanes' union then
  by pairs of lanes (``pair_union``, also served alone for some 16-bit batches): H100 -3 to -10 %.
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

if HAS_TRITON:  # the kernels, one module each (vllm_padplugin/kernels/grouped_topk/)
    from vllm_padplugin.kernels.grouped_topk.parts import _grouped_topk_parts_kernel
    from vllm_padplugin.kernels.grouped_topk.regs import _grouped_topk_regs_kernel
    from vllm_padplugin.kernels.grouped_topk.rows import _grouped_topk_rows_kernel
    from vllm_padplugin.kernels.grouped_topk.tile import _grouped_topk_kernel

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
    where padded rows load their logits, by default up to 4096 tokens): where it won on the H100
    (benchmarks/mask_cost.py, results/mask_cost_h100_early_flag.*: the mask with nothing padded
    from +1.3-6.0 % to -0.0-+2.8 % at <= 1024 tokens).  Routers that drop groups (DeepSeek-V3):
    yes.  Routers that keep every group (Kimi-style): no (+1.1 to +1.9 points at 16 / 64 tokens)."""
    return drops_groups


def top4_served(num_tokens: int, drops_groups: bool, itemsize: int) -> bool:
    """Whether the served short-chain "regs" build keeps each lane's 4 best choices (``TOP4``,
    its threshold by pairs of lanes and its write split, see ``fused_grouped_topk``) instead of 8:
    where it won (benchmarks/kernel_ab.py: median < -1 %, 90th percentile < 0), fp32 DeepSeek-V3
    and 16-bit Kimi-style from 4096 tokens.  H100, 2026-12-07 (results/kernel_ab_h100_pairs_split*):
    -4.4 to -6.9 % (DeepSeek-V3 fp32, 4096-32768) and -3.4 to -10.0 % (Kimi-style bf16); at 2048
    tokens +2.0 / +0.7 %.  (Before its threshold went by pairs and its write was split, H200: from
    16384 tokens only.)  Elsewhere it lost: more rows need the fallback (a lane holding more than
    4 of a row's 8 best): bf16 DeepSeek-V3 with 32 logits a lane +12 to +26 % at 4096-16384, fp32
    Kimi-style +5 to +13 % at 8192-32768."""
    return num_tokens >= 4096 and (itemsize == 4) == drops_groups


def pair_union_served(num_tokens: int, drops_groups: bool, itemsize: int) -> bool:
    """Whether the served short-chain "regs" build takes its threshold by ``_pair_thr8`` (a sorted
    8 held by two lanes) instead of a butterfly of sorted 8s: where it won (same rule, H100,
    2026-12-07, results/kernel_ab_h100_pairs_split*): with ``top4`` (always by pairs), bf16
    DeepSeek-V3 (8 lanes) from 8192 tokens (-1.2 to -3.8 %; +0.7 / +1.1 % at 4096), 16-bit
    Kimi-style above 1024 tokens (-3.1 % at 2048).  Not for fp32 Kimi-style (+1.3 to +1.6 % at
    16384 / 32768) nor fp32 DeepSeek-V3 below 4096 (-0.7 % at 2048, +0.4 % at 256)."""
    if top4_served(num_tokens, drops_groups, itemsize):
        return True
    if drops_groups:
        return itemsize < 4 and num_tokens >= 8192
    return itemsize < 4 and num_tokens > 1024


def skip_padded_loads_served(num_tokens: int, kernel: str) -> bool:
    """Whether padded rows skip their logits load (their loads then wait for the padding flag):
    "regs" above 4096 tokens, the other kernels above 1024.  At 4096 tokens "regs" with nothing
    padded paid 0.7-2.6 points more for the mask when its loads waited for the flag, every router
    and dtype, H200 and H100 (benchmarks/mask_cost.py, results/mask_cost_h{100,200}_served_pairs.*:
    nopad against nopad_loads); a quarter padded, skipping saved 1.7-8.8 points there.  Above 4096
    loading them cost more (fp32 Kimi-style +6 to +13 % at 16384 / 32768)."""
    return num_tokens > (4096 if kernel == "regs" else 1024)


def pad_reload_served(num_tokens: int, drops_groups: bool, itemsize: int) -> bool:
    """Whether the masked "regs" build loads the padding flag again for its writes (``PAD_RELOAD``):
    not yet served anywhere (2026-12-07: waiting for its A/B)."""
    return False


def flat_loads_served(num_tokens: int, drops_groups: bool, itemsize: int) -> bool:
    """Whether "regs" loads its logits as [1, BM P, VEC] (``FLAT``) instead of [BM, P, VEC]: not yet
    served anywhere (2026-12-07: waiting for its A/B on the device, whose Triton is 3.6).  SASS for
    sm_90 of the served builds' common path (results/sass_flat_loads_by_triton.json): Triton 3.6 2.6-6.8 %
    fewer instructions unmasked, 2.5-7.2 % masked (the shuffles that change the choices' layout gone,
    the flags read flat); Triton 3.7, 3.8 and 3.9 order the loads lane-fastest already (0.0 to +1.8 %
    with it).  Where it wins, the rule to serve it is the installed Triton being older than 3.7."""
    return False


def bf16_pairs_served(num_tokens: int, drops_groups: bool) -> bool:
    """Whether "regs" converts bf16 logits two a register by ``_bf16_pairs_to_f32`` (a shift or a
    mask a logit) instead of Triton's conversion: not yet served anywhere (2026-12-07: waiting for
    its A/B).  SASS for sm_90 (Triton 3.6 and 3.9): 16 instructions fewer on the common path of the
    8-lane DeepSeek-V3 build with ``flat_loads`` (823 -> 807)."""
    return False


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
    pair_union: bool | None = None,
    max_registers: int | None = None,
    pad_reload: bool | None = None,
    flat_loads: bool | None = None,
    bf16_pairs: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid grouped top-k + mask in one launch; returns ``(weights f32, ids i32)``.

    ``gating_output``: [T, E] float32 / bfloat16 / float16 logits.
    ``out`` = preallocated ``(weights, ids)`` (contiguous [T, topk]) to write into.
    ``is_padding`` may be longer than the batch; only ``[:T]`` is read.
    ``skip_padded_loads`` makes padded rows skip their logits load, which pays when
    bandwidth-bound and costs a dependent load when latency-bound; default (None): where it paid,
    ``skip_padded_loads_served``.
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
    ``top4`` ("regs" with ``short_chain``, >= 4 lanes a token): each lane sorts its 4 best
    choices instead of 8; the 8th best of the lanes' union is the threshold wherever a row then
    has exactly ``topk`` choices at or above it, else the block takes each lane's 8 best from its
    logits loaded again (same results); with it the threshold goes by pairs of lanes and, <= 32
    logits a lane, the output is written in each branch of the block's exactness test, so that the
    common one knows a lane takes at most 4 experts (3 dependent bit drops a slot instead of 7);
    default (None): where it won, ``top4_served``.
    ``pair_union`` ("regs" with ``short_chain``, >= 4 lanes a token): the threshold from the lanes'
    lists merged with a sorted 8 held by two lanes (``_pair_thr8``; same threshold); default
    (None): where it won, ``pair_union_served``.
    ``max_registers`` ("regs"): the register cap to compile with instead of ``_regs_cap``'s.
    ``pad_reload`` ("regs" with a mask): the padding flag loaded again for the writes instead of
    held in a register across the routing; default (None): where it won, ``pad_reload_served``.
    ``flat_loads`` ("regs"): the logits loaded lane-fastest as [1, BM P, VEC], so that Triton 3.6
    gives the choices the lanes' layout without a shuffle each; default (None): where it won,
    ``flat_loads_served``.
    ``bf16_pairs`` ("regs", bf16 logits): two logits a register converted by a shift and a mask
    (``_bf16_pairs_to_f32``); default (None): where it won, ``bf16_pairs_served``.
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
        SKIP_PADDED_LOADS=(skip_padded_loads_served(num_tokens, kern) if skip_padded_loads is None
                           else skip_padded_loads),
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
                cap = {"maxnreg": max_registers} if max_registers else _regs_cap(sp)
            drops = num_expert_group > topk_group
            if short_chain is None:
                short_chain = short_chain_served(num_tokens, drops)
            if early_flag is None:
                early_flag = early_flag_served(drops)
            size = gating_output.dtype.itemsize
            if top4 is None:
                top4 = top4_served(num_tokens, drops, size)
            if pair_union is None:
                pair_union = pair_union_served(num_tokens, drops, size)
            if pad_reload is None:
                pad_reload = pad_reload_served(num_tokens, drops, size)
            if flat_loads is None:
                flat_loads = flat_loads_served(num_tokens, drops, size)
            if bf16_pairs is None:
                bf16_pairs = bf16_pairs_served(num_tokens, drops)
            pairs_ok = short_chain and lanes >= 4  # _pair_thr8 needs 2 pairs of lanes
            _grouped_topk_regs_kernel[grid](*args, P=lanes, SP=sp, LPG=lpg, SHORT_CHAIN=short_chain,
                                            EARLY_FLAG=bool(early_flag), TOP4=bool(top4 and pairs_ok),
                                            PAIRS=bool(pair_union and pairs_ok),
                                            PAD_RELOAD=bool(pad_reload and is_padding is not None),
                                            FLAT=bool(flat_loads),
                                            BF16_PAIRS=bool(bf16_pairs and gating_output.dtype == torch.bfloat16),
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
