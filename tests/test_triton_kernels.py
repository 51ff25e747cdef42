"""Triton kernels: import without Triton, CPU fallback, CPU interpreter, and the real GPU.

* CPU (always): the kernels package imports and works when ``triton`` cannot be imported
  (a subprocess blocks the import: that is the only fake here), and the entry points
  fall back to the torch core / reference on CPU tensors.
* Triton's own CPU interpreter (``TRITON_INTERPRET=1``, when triton is installed): the
  real kernel source runs on CPU tensors in a subprocess and must match the torch
  reference (mask: bit for bit; fused grouped top-k: ids as sets, weights to 1e-5).
* ``gpu`` (skipped cleanly without CUDA + Triton): the compiled kernels against the torch
  reference, large batches, non-contiguous views, and CUDA-graph capture + replay.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from vllm_padplugin.kernels import HAS_TRITON, mask_padded_routes_inplace
from vllm_padplugin.kernels.reference import decision_margin, grouped_topk_reference
from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk
from vllm_padplugin.masking import mask_padded_routes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU = torch.cuda.is_available() and HAS_TRITON
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and triton")
ROUTERS = [(256, 8, 4, 8, 2.5), (384, 1, 1, 8, 2.827)]  # DeepSeek-V3, Kimi-style


def _run_py(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=240,
    )


# Triton's interpreter before triton-lang/triton#9172 (3.6 still has it) turns a loop bound that
# the kernel computes into int() of a 1-element array, which numpy >= 2.4 refuses (#9171)
_INTERPRETER_NUMPY_BUG = ("int(self.handle.data))", "only 0-dimensional arrays can be converted")


def _run_interpreted(code: str) -> None:
    """Run ``code`` under Triton's CPU interpreter in a subprocess; it must print "ok".  Skips,
    naming the upstream bug, where that interpreter cannot run a loop with a computed bound."""
    r = _run_py(code, TRITON_INTERPRET="1")
    if r.returncode and all(s in r.stderr for s in _INTERPRETER_NUMPY_BUG):
        pytest.skip("this Triton's interpreter cannot take a loop bound from a tensor under numpy >= 2.4 "
                    "(triton-lang/triton#9171, fixed by #9172); the gpu tests run the compiled kernel")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout[-1000:], r.stderr[-3000:])


def bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same_routing(fw, fi, rw, ri, atol=1e-5):
    """ids equal as sets per row; weights equal per expert id within atol."""
    fs, fo = fi.long().sort(1)
    rs, ro = ri.long().sort(1)
    assert torch.equal(fs, rs), f"{int((fs != rs).any(1).sum())} rows pick other experts"
    torch.testing.assert_close(fw.gather(1, fo), rw.gather(1, ro), atol=atol, rtol=1e-5)


def same_routing_up_to_near_ties(fw, fi, rw, ri, choice, G, TG, K, atol=1e-5, tie_eps=2e-6, max_tie_frac=1e-3):
    """Like ``same_routing``, except that a row may pick another id set where the
    reference's own decision was a near-tie (its group or k-th-expert margin, from torch's
    fp32 scores, below ``tie_eps``): Triton's sigmoid and torch's may differ in the last
    bit, so such a row can go either way.  Such rows must stay rare."""
    fs, fo = fi.long().sort(1)
    rs, ro = ri.long().sort(1)
    differ = (fs != rs).any(1)
    if differ.any():
        margin = decision_margin(choice[differ], ri[differ], G, TG, K)
        assert (margin <= tie_eps).all(), f"rows pick other experts, not at a near-tie: margins {margin.tolist()[:5]}"
        assert differ.float().mean() <= max_tie_frac, f"{int(differ.sum())} near-tie rows"
    ok = ~differ
    torch.testing.assert_close(fw[ok].gather(1, fo[ok]), rw[ok].gather(1, ro[ok]), atol=atol, rtol=1e-5)


def test_reference_breaks_ties_to_the_lowest_id():
    """The reference is a definition: equal scores -> lowest expert id, equal group ranks ->
    lowest group id (torch.topk's tie order is unspecified)."""
    x = torch.zeros(3, 16)
    x[:, 10:] = 1.0  # experts 10..15 best, then 0..9 all tied
    w, ids = grouped_topk_reference(x, None, topk=8, num_expert_group=1, topk_group=1)
    assert ids.sort(1).values.tolist() == [[0, 1, 10, 11, 12, 13, 14, 15]] * 3
    g = torch.zeros(2, 16)  # 4 groups of 4, all tied: groups 0 and 1 win
    w, ids = grouped_topk_reference(g, torch.zeros(16), topk=3, num_expert_group=4, topk_group=2)
    assert ids.sort(1).values.tolist() == [[0, 1, 2]] * 2


def test_import_and_fallback_without_triton():
    r = _run_py(
        """
        import sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        import torch
        from vllm_padplugin.kernels import HAS_TRITON, mask_padded_routes_inplace
        from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk
        assert HAS_TRITON is False
        w = torch.rand(4, 8); ids = torch.arange(32, dtype=torch.int32).view(4, 8)
        mask_padded_routes_inplace(w, ids, torch.tensor([True, False, True, False, True]))
        assert (ids[0] == -1).all() and (w[2] == 0).all() and ids[1, 0] == 8
        fw, fi = fused_grouped_topk(torch.randn(3, 256), torch.zeros(256), topk=8,
                                    num_expert_group=8, topk_group=4)
        assert fi.shape == (3, 8) and fi.dtype == torch.int32
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_cpu_tensors_use_the_torch_core():
    w = torch.randn(6, 8, dtype=torch.bfloat16)
    ids = torch.randint(0, 256, (6, 8))
    mask = torch.tensor([0, 1, 1, 0, 0, 1, 1, 1], dtype=torch.bool)
    ref_w, ref_ids = mask_padded_routes(w, ids, mask)
    out_w, out_ids = mask_padded_routes_inplace(w, ids, mask)
    assert out_w is w and out_ids is ids
    assert torch.equal(bits(w), bits(ref_w)) and torch.equal(ids, ref_ids)


def test_bad_mask_raises_before_any_kernel():
    from vllm_padplugin.masking import PaddingMaskError

    with pytest.raises(PaddingMaskError, match=r"shape \(3,\).*5 rows"):
        mask_padded_routes_inplace(torch.rand(5, 8), torch.zeros(5, 8, dtype=torch.int32), torch.zeros(3, dtype=torch.bool))


def test_fused_fallback_equals_reference_on_cpu():
    x, b = torch.randn(9, 256), torch.randn(256) * 0.05
    mask = torch.rand(12) < 0.4
    kw = dict(topk=8, num_expert_group=8, topk_group=4, routed_scaling_factor=2.5)
    fw, fi = fused_grouped_topk(x, b, is_padding=mask, **kw)
    rw, ri = grouped_topk_reference(x, b, is_padding=mask, **kw)
    assert torch.equal(fi, ri) and torch.equal(fw, rw)
    assert (fi[mask[:9]] == -1).all() and (fw[mask[:9]] == 0).all()


def test_default_config_picks_regs_where_it_was_timed():
    """The serving path's kernel choice (H200 sweeps, H100 kernel_ab_h100_lanes16): "regs" at every
    size where it applies, with 32 lanes per token (BLOCK_M 1) below 1024 tokens and 16 (BLOCK_M 2)
    above for routers that drop groups (DeepSeek-V3), except 8 (BLOCK_M 4) for 16-bit logits from
    4096 tokens; 16 lanes at every size for Kimi-style; "parts"/"tile" where regs does not apply
    (topk != 8, a lane over 64 experts)."""
    from vllm_padplugin.kernels.triton_grouped_topk import default_config

    ds = dict(num_expert_group=8, topk_group=4, topk=8)
    kimi = dict(num_expert_group=1, topk_group=1, topk=8)
    for dt in (torch.float32, torch.bfloat16):
        assert default_config(16, 256, dt, **ds) == default_config(1023, 256, dt, **ds) == ("regs", 1, 1)
        assert default_config(1024, 256, dt, **ds) == default_config(4095, 256, dt, **ds) == ("regs", 2, 1)
        assert default_config(16, 384, dt, **kimi) == default_config(32768, 384, dt, **kimi) == ("regs", 2, 1)
    assert default_config(4096, 256, torch.float32, **ds) == default_config(32768, 256, None, **ds) == ("regs", 2, 1)
    for dt in (torch.bfloat16, torch.float16):
        assert default_config(4096, 256, dt, **ds) == default_config(32768, 256, dt, **ds) == ("regs", 4, 1)
    assert default_config(32768, 256, torch.float32, num_expert_group=8, topk_group=4, topk=6)[0] == "parts"
    assert default_config(32768, 1024, torch.float32)[0] == "parts"  # 128 experts per lane
    assert default_config(16, 384, torch.float32, topk=6)[0] == "tile"


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no interpreter to run the kernel source")
def test_kernel_source_under_triton_interpreter():
    _run_interpreted(
        """
        import torch
        from vllm_padplugin.kernels.triton_mask import can_use_triton, mask_padded_routes_inplace
        from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk
        from vllm_padplugin.kernels.reference import grouped_topk_reference
        from vllm_padplugin.masking import mask_padded_routes
        assert can_use_triton(torch.zeros(1))
        torch.manual_seed(0)
        for T, k, idt, wdt in [(1, 8, torch.int32, torch.float32), (37, 13, torch.int64, torch.bfloat16),
                               (70, 16, torch.int32, torch.float16)]:
            w = torch.randn(T, k).to(wdt); ids = torch.randint(0, 256, (T, k), dtype=idt)
            m = torch.rand(T + 5) < 0.5
            rw, ri = mask_padded_routes(w, ids, m)
            mask_padded_routes_inplace(w, ids, m)
            assert torch.equal(ids, ri) and torch.equal(w.view(torch.int16 if wdt != torch.float32 else torch.int32),
                                                       rw.view(torch.int16 if wdt != torch.float32 else torch.int32))
        for E, G, TG, K, s in [(256, 8, 4, 8, 2.5), (384, 1, 1, 8, 2.827)]:
            for bias in (True, False):
                x = torch.randn(6, E); b = torch.randn(E) * 0.05 if bias else None
                m = torch.rand(8) < 0.4
                kw = dict(topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=s, is_padding=m)
                fw, fi = fused_grouped_topk(x, b, block_m=4, **kw)
                rw, ri = grouped_topk_reference(x, b, **kw)
                fs, fo = fi.long().sort(1); rs, ro = ri.long().sort(1)
                assert torch.equal(fs, rs), (E, bias)
                assert torch.allclose(fw.gather(1, fo), rw.gather(1, ro), atol=1e-6, rtol=1e-5)
        # bf16 logits, and ties everywhere (integer logits): lowest id wins, as the reference
        for E, G, TG, K, s in [(256, 8, 4, 8, 2.5), (384, 1, 1, 8, 2.827)]:
            for x, b in [(torch.randn(11, E).to(torch.bfloat16), torch.randn(E) * 0.05),
                         (torch.randint(-2, 3, (11, E)).float(), None),
                         (torch.randint(-2, 3, (11, E)).to(torch.bfloat16), torch.full((E,), 0.25))]:
                for bm in (1, 4):
                    kw = dict(topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=s)
                    fw, fi = fused_grouped_topk(x, b, block_m=bm, **kw)
                    rw, ri = grouped_topk_reference(x, b, **kw)
                    fs, fo = fi.long().sort(1); rs, ro = ri.long().sort(1)
                    assert torch.equal(fs, rs), (E, x.dtype, b is None, bm)
                    assert torch.allclose(fw.gather(1, fo), rw.gather(1, ro), atol=1e-6, rtol=1e-5)
        print("ok")
        """
    )



def test_short_chain_served_where_it_won():
    """The served "regs" build follows results/kernel_ab_h200.* and kernel_ab_h100_*: short_chain for
    routers that drop groups at every size; for routers that keep every group above 1024 tokens
    (it lost 1-2 % at <= 1024 tokens)."""
    from vllm_padplugin.kernels.triton_grouped_topk import short_chain_served

    for T in (1, 16, 256, 1024, 4096, 32768):
        assert short_chain_served(T, True)
    assert [short_chain_served(T, False) for T in (16, 1024, 1025, 4096, 4097, 32768)] == [
        False, False, True, True, True, True]


def test_top4_served_where_it_won():
    """Lanes keep their 4 best from 4096 tokens for fp32 DeepSeek-V3 and 16-bit Kimi-style only
    (results/kernel_ab_h100_pairs_split*: elsewhere it was even or lost)."""
    from vllm_padplugin.kernels.triton_grouped_topk import top4_served

    assert [top4_served(T, True, 4) for T in (16, 2048, 4095, 4096, 65536)] == [False] * 3 + [True] * 2
    assert [top4_served(T, False, 2) for T in (16, 2048, 4096, 32768)] == [False, False, True, True]
    assert not any(top4_served(T, d, i) for T in (4096, 65536) for d, i in ((True, 2), (False, 4)))


def test_pair_union_served_where_it_won():
    """The threshold goes by pairs of lanes wherever ``top4`` is served, for bf16 DeepSeek-V3 from
    8192 tokens and 16-bit Kimi-style above 1024 (its short chain); never for fp32 Kimi-style
    (results/kernel_ab_h100_pairs_split*)."""
    from vllm_padplugin.kernels.triton_grouped_topk import pair_union_served, top4_served

    for T in (16, 1024, 2048, 4096, 8192, 32768):
        for d, i in ((True, 4), (True, 2), (False, 4), (False, 2)):
            if top4_served(T, d, i):
                assert pair_union_served(T, d, i)
    assert [pair_union_served(T, True, 2) for T in (256, 4096, 8191, 8192, 32768)] == [False] * 3 + [True] * 2
    assert [pair_union_served(T, True, 4) for T in (256, 2048, 4096)] == [False, False, True]
    assert [pair_union_served(T, False, 2) for T in (1024, 1025, 2048)] == [False, True, True]
    assert not any(pair_union_served(T, False, 4) for T in (16, 2048, 4096, 32768))


def test_skip_padded_loads_served_where_it_paid():
    """"regs" lets padded rows load their logits up to 4096 tokens (results/mask_cost_h*_served_pairs.*:
    the mask with nothing padded 0.7-2.6 points cheaper at 4096 without the wait for the flag), the
    other kernels up to 1024, as before; above, padded rows skip their logits."""
    from vllm_padplugin.kernels.triton_grouped_topk import skip_padded_loads_served

    assert [skip_padded_loads_served(T, "regs") for T in (16, 1024, 4096, 4097, 32768)] == [False] * 3 + [True] * 2
    for k in ("tile", "parts", "rows"):
        assert [skip_padded_loads_served(T, k) for T in (1024, 1025, 4096)] == [False, True, True]


def test_early_flag_served_where_it_won():
    """The padding flag's load is issued early (where padded rows load their logits) for routers
    that drop groups only: results/mask_cost_h100_early_flag.* (Kimi-style lost at 16 / 64 tokens)."""
    from vllm_padplugin.kernels.triton_grouped_topk import early_flag_served

    assert early_flag_served(True) and not early_flag_served(False)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no compiler")
def test_regs_fits_its_register_cap_without_spills():
    """fused_grouped_topk launches "regs" with maxnreg=64 for lanes of <= 32 logits (DeepSeek-V3),
    so that the mask does not cost blocks per SM (issue 11, H200 ncu).  Compiled here for sm_90
    with the installed Triton's ptxas (no GPU): with and without the mask, 8 / 16 / 32 lanes, and
    the short_chain variant (and its early_flag build, and its top4 build at 16 / 32 lanes, where
    it is served), fp32 and bf16, the kernel must fit the cap with no spill, or the cap costs
    local-memory traffic.  (top4 at 8 lanes spilled 8 B before its threshold went by pairs of lanes;
    now it spills nothing there and loses all the same, by its fallback's frequency.)"""
    names = {"regs"} | {f"regs+mask{v}{at}" for v in ("", "+short", "+short+loads+early")
                        for at in ("", "@16", "@32")}  # 8 lanes (served above 4096 tokens), 16, 32
    names |= {"regs+mask+short+top4@16", "regs+mask+short+top4@32"}
    stats = list(_sass_stats(names))
    assert len(stats) == 2 * len(names)  # fp32, bf16
    for r in stats:
        assert r["options"].get("maxnreg") == 64, r
        assert r["registers"] <= 64 and r["stack"] == 0, r


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no compiler")
def test_regs_early_flag_issues_the_flag_load_before_the_routing():
    """``early_flag`` exists because ptxas sinks the padding flag's load to its first use, after the
    routing, where padded rows load their logits (SASS for sm_90 compiled here, no GPU): the
    early builds must issue it before the first sigmoid, at 8 / 16 / 32 lanes, fp32 and bf16.
    The test also records that the plain builds sink it (if ptxas stops doing so, the switch
    has no reason left)."""
    names = {f"regs+mask+short+loads{e}{at}" for e in ("", "+early") for at in ("", "@16", "@32")}
    stats = list(_sass_stats(names))
    assert len(stats) == 2 * len(names)
    for r in stats:
        early = "+early" in r["name"]
        assert (r["flag_load"] < r["first_sigmoid"]) == early, r


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no compiler")
def test_regs_16_lanes_issue_every_logits_load_up_front():
    """The 16-lane short-chain builds, with and without ``top4`` (as launched: the threshold by
    pairs of lanes, the write split), issue all of a lane's logits loads before the first sigmoid
    (SASS for sm_90 compiled here, no GPU), both routers and dtypes.  Before the pairs and the
    split, ptxas sank 2 of 6 for fp32 Kimi-style's ``top4`` under the 64-register cap; with every
    load up front it still loses there (H100, +5 to +13 % at 8192-32768 tokens,
    results/kernel_ab_h100_pairs_split_top4.*): the fallback's frequency, not late loads.  This holds
    for the installed Triton's ptxas (3.9 here); the device's Triton 3.6 sinks one load of the masked
    bf16 Kimi-style top4 build and two of fp32 Kimi-style's (benchmarks/RESULTS.md, 2026-12-07)."""
    stats = {(r["name"], r["router"], r["dtype"]): r["late_loads"]
             for r in _sass_stats({"regs+mask+short@16", "regs+mask+short+top4@16"}, ("deepseek-v3", "kimi-style"))}
    assert len(stats) == 8
    for (name, router, dt), late in stats.items():
        assert late == 0, (name, router, dt)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no compiler")
def test_regs_pad_reload_issues_every_logits_load_up_front():
    """``pad_reload`` exists because the masked 8-lane build with the pairs (16-bit DeepSeek-V3 from
    8192 tokens) holds the padding flag across the routing and, under the 64-register cap, ptxas
    then issues one of a lane's four logits loads after the first sigmoids (SASS for sm_90 compiled
    here, no GPU; Triton 3.6 and 3.9 alike): loading the flag again for the writes must leave every
    logits load up front.  The test also records that the build without it sinks one (if ptxas
    stops doing so, the option has no reason left).  The same for the build with ``flat_loads`` and
    ``bf16_pairs`` (sinks one masked, Triton 3.6 and 3.9; with the reload none)."""
    names = {"regs+mask+short+pairs", "regs+mask+short+pairs+reload", "regs+mask+short+pairs+flat+bf16pairs",
             "regs+mask+short+pairs+flat+bf16pairs+reload"}
    late = {r["name"]: r["late_loads"] for r in _sass_stats(names, ("deepseek-v3",)) if r["dtype"] == "bf16"}
    assert late == {"regs+mask+short+pairs": 1, "regs+mask+short+pairs+reload": 0,
                    "regs+mask+short+pairs+flat+bf16pairs": 1, "regs+mask+short+pairs+flat+bf16pairs+reload": 0}, late


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no compiler")
def test_regs_flat_loads_take_no_more_shuffles_or_instructions():
    """``flat_loads`` exists because the device's Triton 3.6 gives a [BM, P, VEC] load the rows
    fastest over the threads and the lanes' [BM, P] tensors the lanes fastest, so every column of
    choices and sorted values took a shuffle (SASS for sm_90, DeepSeek-V3 bf16 with the pairs: 90
    shuffles, 879 instructions on the common path; flat 47 and 823, as with Triton 3.9).  The
    served builds (8 lanes with the pairs, 16 with and without top4), flat, must be no worse with
    the installed Triton (3.9 here, which orders them alike; 3.6 passes too): no more shuffles, at
    most 2 % more instructions, 16-byte loads kept (a flat offset built through a reshape lost the
    alignment and gave 2-byte loads with 3.6: tried)."""
    stats = {(r["name"], r["router"], r["dtype"]): r
             for r in _sass_stats({"regs+short+pairs", "regs+short+pairs+flat", "regs+short+top4@16",
                                   "regs+short+top4+flat@16", "regs+short@16", "regs+short+flat@16"},
                                  ("deepseek-v3", "kimi-style"))
             if "pairs" not in r["name"] or r["router"] == "deepseek-v3"}  # Kimi-style: 16 lanes served
    assert len(stats) == 20
    for (name, router, dt), r in stats.items():
        if "+flat" in name:
            base = stats[(name.replace("+flat", ""), router, dt)]
            assert r["shuffles"] <= base["shuffles"], (name, router, dt, r["shuffles"], base["shuffles"])
            assert r["common_path"] <= 1.02 * base["common_path"], (name, router, dt)
            assert r["wide_loads"] == base["wide_loads"] > 0, (name, router, dt)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no compiler")
def test_regs_bf16_pairs_convert_with_fewer_instructions():
    """``bf16_pairs`` exists because ptxas converts the upper bf16 of a register with a byte permute
    and a shift (``PRMT`` + ``IMAD.U32``) where one ``LOP3`` does: the 16-bit builds it applies to
    (DeepSeek-V3 8 lanes with the pairs, Kimi-style 16 lanes with top4; SASS for sm_90) must run at
    least 12 instructions fewer on the common path than the same build with Triton's conversion
    (16 and 12, Triton 3.6 and 3.9 alike) and keep their 16-byte loads.  Its bits are checked on the
    GPU only (test_gpu_regs_variants_match_reference: inline PTX, which the interpreter cannot run)."""
    names = {"regs+short+pairs+flat", "regs+short+pairs+flat+bf16pairs", "regs+short+top4+flat@16",
             "regs+short+top4+flat+bf16pairs@16"}
    stats = {(r["name"], r["router"]): r for r in _sass_stats(names, ("deepseek-v3", "kimi-style"))
             if r["dtype"] == "bf16"}
    for base, router in (("regs+short+pairs+flat", "deepseek-v3"), ("regs+short+top4+flat@16", "kimi-style")):
        pairs = stats[(base.replace("+flat", "+flat+bf16pairs"), router)]
        assert pairs["common_path"] <= stats[(base, router)]["common_path"] - 12, (base, router)
        assert pairs["wide_loads"] == stats[(base, router)]["wide_loads"], (base, router)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no interpreter to run the kernel source")
@pytest.mark.parametrize("variant", [{"top4": True}, {"pair_union": True}, {"pad_reload": True}, {"flat_loads": True},
                                     {"flat_loads": True, "top4": True}, {"flat_loads": True, "pad_reload": True}],
                         ids=["top4", "pair_union", "pad_reload", "flat_loads", "flat_loads_top4", "flat_pad_reload"])
def test_regs_variants_change_no_bit_under_triton_interpreter(variant):
    """``top4`` (lanes sort their 4 best; the threshold by pairs of lanes, the write split: the
    common branch knows a lane takes at most 4) and ``pair_union`` (the lanes' 8-lists merged with
    a sorted 8 held by two lanes) give every output bit as the butterfly of sorted 8s (both
    routers, fp32 / bf16, 8 / 16 / 32 lanes, a mask; rows whose 8 best crowd into few lanes, so
    that top4's fallback runs, and rows with 4 of them in one lane, top4's common path at the
    split write's bound).  A wrong partner lane in ``_pair_thr8`` or too small a bound for the
    split write fails here (checked by editing the kernel).  ``pad_reload`` (the padding flag
    loaded again for the writes) likewise, padded rows (-1, 0), and ``flat_loads`` (the logits and
    bias loaded lane-fastest, each column reshaped to [BM, P]; with ``top4`` its fallback loads them
    again so; with ``pad_reload``, the flag flat for the loads and reloaded [BM, P] for the writes)."""
    _run_interpreted(
        """
        import torch
        from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk
        torch.manual_seed(5)
        for E, G, TG, s, lanes in [(256, 8, 4, 2.5, 8), (256, 8, 4, 2.5, 16), (256, 8, 4, 2.5, 32),
                                   (384, 1, 1, 2.827, 16)]:
            for dt in (torch.float32, torch.bfloat16):
                x = torch.randn(21, E).to(dt)
                x[:5, :24] += 4.0  # the 8 best in the first lanes: top4's fallback
                x[5:9, 32:36] += 4.0  # 4 of the 8 best in one lane: top4's common path at its bound
                b = torch.randn(E) * 0.05
                m = torch.rand(21) < 0.3
                kw = dict(topk=8, num_expert_group=G, topk_group=TG, routed_scaling_factor=s, is_padding=m,
                          kernel="regs", block_m=32 // lanes, num_warps=1, short_chain=True)
                w0, i0 = fused_grouped_topk(x, b, top4=False, pair_union=False, **kw)
                w1, i1 = fused_grouped_topk(x, b, **VARIANT, **kw)
                assert torch.equal(i0, i1) and torch.equal(w0.view(torch.int32), w1.view(torch.int32)), (E, lanes)
                assert (i1[m] == -1).all() and (i1[~m] >= 0).all()
        print("ok")
        """.replace("VARIANT", repr(variant))
    )


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no interpreter to run the kernel source")
def test_regs_early_flag_leaves_other_rows_bit_identical_under_triton_interpreter():
    """``early_flag`` zeroes a padded row's first chunk of logits inside the kernel: rows that are
    not padding must come out bit for bit as without it, padded rows (-1, 0) either way (both
    routers, fp32 / bf16, 8 / 16 / 32 lanes, padded rows loading their logits)."""
    _run_interpreted(
        """
        import torch
        from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk
        torch.manual_seed(3)
        for E, G, TG, s, lanes in [(256, 8, 4, 2.5, 8), (256, 8, 4, 2.5, 16), (256, 8, 4, 2.5, 32), (384, 1, 1, 2.827, 16)]:
            for dt in (torch.float32, torch.bfloat16):
                x = torch.randn(29, E).to(dt)
                b = torch.randn(E) * 0.05
                m = torch.rand(29) < 0.4
                kw = dict(topk=8, num_expert_group=G, topk_group=TG, routed_scaling_factor=s, is_padding=m,
                          kernel="regs", block_m=32 // lanes, num_warps=1, skip_padded_loads=False)
                w0, i0 = fused_grouped_topk(x, b, early_flag=False, **kw)
                w1, i1 = fused_grouped_topk(x, b, early_flag=True, **kw)
                assert torch.equal(i0, i1) and torch.equal(w0.view(torch.int32), w1.view(torch.int32)), (E, lanes, dt)
                assert (i1[m] == -1).all() and (w1[m] == 0).all() and (i1[~m] >= 0).all()
        print("ok")
        """
    )


def _sass_stats(names, routers=("deepseek-v3",)):
    """``profile_grouped_topk.sass_stats`` for the builds ``names`` of ``routers`` (skips without ptxas)."""
    import triton

    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")):
        pytest.skip("this Triton ships no NVIDIA tools (ptxas / cuobjdump)")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import profile_grouped_topk
    finally:
        sys.path.pop(0)
    return profile_grouped_topk.sass_stats(kernels=names, routers=set(routers))


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no interpreter to run the kernel source")
@pytest.mark.parametrize("kernel,short_chain,early_flag,top4", [
    ("rows", False, False, False), ("parts", False, False, False), ("regs", False, False, False),
    ("regs", True, False, False), ("regs", True, True, False), ("regs", True, False, True)])
def test_rows_and_parts_kernels_under_triton_interpreter(kernel, short_chain, early_flag, top4):
    """The one-thread-per-token ("rows") and lanes-per-token ("parts", "regs") kernels' source, run by
    the interpreter: both routers, fp32 / bf16, bias or not, mask, sort-merge and insertion,
    renormalised or not, integer logits (ties everywhere: lowest id wins); "regs" also as its
    ``short_chain`` variant (groups ranked by counting, taken experts by a population count, the
    tie path on the integer logits), with ``early_flag`` (a padded row's first chunk zeroed), and
    with ``top4`` (lanes keep their 4 best; rows whose 8 best share a lane take the fallback)."""
    # short_chain=False: the long chain, not the default; early_flag: 37 tokens load padded rows' logits
    extra = f", short_chain={short_chain}, early_flag={early_flag}, top4={top4}" if kernel == "regs" else ""
    _run_interpreted(
        f"""
        import torch
        from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk
        from vllm_padplugin.kernels.reference import grouped_topk_reference
        torch.manual_seed(0)
        # DeepSeek-V3 (parts: kept groups spread over the lanes), Kimi-style (no group dropped),
        # a top-6 (insertion), DeepSeek-V2-like 160/8/3/6 (parts: lanes of dropped groups idle)
        cases = [(256, 8, 4, 8, 2.5), (384, 1, 1, 8, 2.827), (128, 4, 2, 6, 1.0), (160, 8, 3, 6, 16.0)]
        if "{kernel}" == "regs":  # its other lane shapes: 16 / 64 experts per lane, 32-bit / 64-bit masks
            cases = [cases[0], cases[1], (128, 8, 4, 8, 1.0), (512, 1, 1, 8, 1.0), (256, 4, 4, 8, 1.0)]
        for E, G, TG, K, s in cases:
            for dt, ints, bias, merge, renorm in [(torch.float32, False, True, None, True),
                                                  (torch.bfloat16, False, True, None, True),
                                                  (torch.float32, False, False, False, False),
                                                  (torch.float32, True, True, None, True),
                                                  (torch.bfloat16, True, False, False, True)]:
                x = (torch.randint(-2, 3, (37, E)).float() if ints else torch.randn(37, E)).to(dt)
                if {top4}:  # rows 0-5: the 8 best in the first lane (more than 4 there: the fallback)
                    x[:6, :8] += 6
                b = (torch.full((E,), 0.25) if ints else torch.randn(E) * 0.05) if bias else None
                m = torch.rand(40) < 0.3
                kw = dict(topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=s,
                          renormalize=renorm, is_padding=m)
                # regs: its 8-lane layout (BLOCK_M 4); the wider ones in test_regs_wide_lanes_*
                fw, fi = fused_grouped_topk(x, b, kernel="{kernel}", merge=merge, block_m=4, num_warps=1{extra}, **kw)
                rw, ri = grouped_topk_reference(x, b, **kw)
                fs, fo = fi.long().sort(1); rs, ro = ri.long().sort(1)
                assert torch.equal(fs, rs), (E, dt, ints, bias)
                assert torch.allclose(fw.gather(1, fo), rw.gather(1, ro), atol=1e-6, rtol=1e-5)
                live = ~m[:37]
                assert torch.equal(fi[live], fi[live].sort(1).values)  # ascending expert id
        print("ok")
        """
    )


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed: no interpreter to run the kernel source")
@pytest.mark.parametrize("short_chain,top4", [(False, False), (True, False), (True, True)])
def test_regs_wide_lanes_under_triton_interpreter(short_chain, top4):
    """"regs" with more lanes per token than groups (BLOCK_M = 32 x warps / lanes: a group spans
    neighbouring lanes, its rank a top-2 reduction over them; the small-batch layout): the
    reference's sets, ascending ids, padded rows (-1, 0); lanes a router cannot take fall back to
    its own default layout.  With ``short_chain`` too (the group's two best by a butterfly), and
    ``top4`` (rows 0-3: their 8 best in the first lane, the fallback)."""
    _run_interpreted(
        f"""
        import torch
        from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk, _regs_lanes
        from vllm_padplugin.kernels.reference import grouped_topk_reference
        torch.manual_seed(1)
        assert _regs_lanes(256, 8, 4, 8, 4, 32) == 32 and _regs_lanes(256, 8, 4, 8, 4, 4) == 0  # < groups
        assert _regs_lanes(384, 1, 1, 8, 4, 16) == 16 and _regs_lanes(384, 1, 1, 8, 4, 32) == 0  # 12 a lane
        assert _regs_lanes(128, 1, 1, 8, 4, 4) == 4  # fewer lanes than output slots
        cases = [(256, 8, 4, 8, 2.5, 16), (256, 8, 4, 8, 2.5, 32), (384, 1, 1, 8, 2.827, 16),
                 (128, 4, 2, 8, 1.0, 16), (384, 1, 1, 8, 1.0, 32), (128, 1, 1, 8, 1.0, 4)]  # 4: 2 slots a lane
        for E, G, TG, K, s, lanes in cases:
            for dt, ints, bias in [(torch.float32, False, True), (torch.bfloat16, False, True),
                                   (torch.float32, False, False), (torch.float32, True, True),
                                   (torch.bfloat16, True, False)]:
                x = (torch.randint(-2, 3, (21, E)).float() if ints else torch.randn(21, E)).to(dt)
                if {top4}:
                    x[:4, :8] += 6
                b = (torch.full((E,), 0.25) if ints else torch.randn(E) * 0.05) if bias else None
                m = torch.rand(23) < 0.3
                kw = dict(topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=s, is_padding=m)
                fw, fi = fused_grouped_topk(x, b, kernel="regs", block_m=32 // lanes, num_warps=1,
                                            short_chain={short_chain}, top4={top4}, **kw)
                rw, ri = grouped_topk_reference(x, b, **kw)
                fs, fo = fi.long().sort(1); rs, ro = ri.long().sort(1)
                assert torch.equal(fs, rs), (E, lanes, dt, ints, bias)
                assert torch.allclose(fw.gather(1, fo), rw.gather(1, ro), atol=1e-6, rtol=1e-5)
                live = ~m[:21]
                assert torch.equal(fi[live], fi[live].sort(1).values)
                assert (fi[m[:21]] == -1).all() and (fw[m[:21]] == 0).all()
        print("ok")
        """
    )


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("T", [1, 16, 257, 4096, 32768])
@pytest.mark.parametrize("k", [1, 8, 16])
@pytest.mark.parametrize("wdt", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_gpu_mask_kernel_bit_for_bit(T, k, wdt, idt):
    g = torch.Generator(device="cuda").manual_seed(T * 31 + k)
    w = torch.randn(T, k, generator=g, device="cuda").to(wdt)
    ids = torch.randint(0, 256, (T, k), generator=g, device="cuda", dtype=idt)
    mask = torch.rand(T + 33, generator=g, device="cuda") < 0.4
    ref_w, ref_ids = mask_padded_routes(w, ids, mask)
    out_w, out_ids = mask_padded_routes_inplace(w, ids, mask)
    assert out_w is w and out_ids is ids
    assert torch.equal(ids, ref_ids) and torch.equal(bits(w), bits(ref_w))


@pytest.mark.gpu
@needs_gpu
def test_gpu_mask_kernel_non_contiguous_views():
    base_w = torch.randn(64, 20, device="cuda")
    base_ids = torch.randint(0, 256, (20, 64), device="cuda")
    w, ids = base_w[:, 2:10], base_ids.t()[:, 5:13]  # strided views
    mask_base = torch.rand(128, device="cuda") < 0.5
    mask = mask_base[::2]  # stride-2 mask
    ref_w, ref_ids = mask_padded_routes(w, ids, mask)
    before_w = base_w.clone()
    mask_padded_routes_inplace(w, ids, mask)
    assert torch.equal(ids, ref_ids) and torch.equal(w, ref_w)
    assert torch.equal(base_w[:, :2], before_w[:, :2]) and torch.equal(base_w[:, 10:], before_w[:, 10:])


@pytest.mark.gpu
@needs_gpu
def test_gpu_mask_kernel_in_cuda_graph_reads_mask_at_replay():
    T, k = 512, 8
    w0 = torch.randn(T, k, device="cuda")
    ids0 = torch.randint(0, 256, (T, k), device="cuda", dtype=torch.int32)
    w, ids = w0.clone(), ids0.clone()
    mask = torch.zeros(T + 64, dtype=torch.bool, device="cuda")  # persistent, longer than the batch
    mask_padded_routes_inplace(w, ids, mask)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mask_padded_routes_inplace(w, ids, mask)
    for p in (0.0, 0.3, 1.0):
        mask.copy_(torch.rand(T + 64, device="cuda") < p)
        w.copy_(w0)
        ids.copy_(ids0)
        graph.replay()
        ref_w, ref_ids = mask_padded_routes(w0, ids0, mask)
        assert torch.equal(ids, ref_ids) and torch.equal(w, ref_w)


# the shapes benchmarks/gpu_masking.py times (its TOKENS), plus odd sizes
GPU_TOKENS = [1, 16, 64, 256, 257, 1000, 1024, 4096, 16384, 32768]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("E,G,TG,K,scale", ROUTERS)
@pytest.mark.parametrize("T", GPU_TOKENS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kernel", [None, "tile", "rows", "parts", "regs"])
def test_gpu_fused_grouped_topk_matches_reference(E, G, TG, K, scale, T, dtype, bias, kernel):
    """Every kernel at every timed shape (None = the size's default_config)."""
    if kernel is not None and (T in (1, 257, 1000) or not bias):
        pytest.skip("the default config covers every case; each kernel explicitly at the timed sizes, with bias")
    g = torch.Generator(device="cuda").manual_seed(T + E)
    x = torch.randn(T, E, generator=g, device="cuda").to(dtype)
    b = torch.randn(E, generator=g, device="cuda") * 0.05 if bias else None
    mask = torch.rand(T + 7, generator=g, device="cuda") < 0.3
    kw = dict(topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=scale, is_padding=mask)
    out = (torch.full((T, K), float("nan"), device="cuda"), torch.full((T, K), -7, dtype=torch.int32, device="cuda"))
    fw, fi = fused_grouped_topk(x, b, out=out, kernel=kernel, **kw)
    rw, ri = grouped_topk_reference(x, b, **kw)
    pad = mask[:T]
    assert (fi[pad] == -1).all() and (fw[pad] == 0).all()
    assert (fi != -7).all() and torch.isfinite(fw).all()  # every element written
    choice = x.float().sigmoid() + (b if bias else 0)
    same_routing_up_to_near_ties(fw[~pad], fi[~pad], rw[~pad], ri[~pad], choice[~pad], G, TG, K)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("E,G,TG,K,scale", ROUTERS)
@pytest.mark.parametrize("T", [1, 16, 64, 256, 1024, 4096])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lanes", [16, 32])
def test_gpu_regs_wide_lanes_matches_reference(E, G, TG, K, scale, T, dtype, lanes):
    """"regs" with 16 / 32 lanes per token at the sizes it is timed at, with a bias and a mask;
    integer logits (ties everywhere) too."""
    from vllm_padplugin.kernels.triton_grouped_topk import _regs_lanes

    if not _regs_lanes(E, G, TG, K, 16 // torch.tensor([], dtype=dtype).element_size(), lanes):
        pytest.skip("this router's lanes would not hold whole chunks of 8")
    _regs_matches_reference(E, G, TG, K, scale, T, dtype, T + E + lanes, kernel="regs", block_m=32 // lanes,
                            num_warps=1)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("E,G,TG,K,scale", ROUTERS)
@pytest.mark.parametrize("T", [16, 256, 1024, 4096, 16384, 32768])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", [{"short_chain": False}, {"short_chain": True},
                                     {"early_flag": True, "skip_padded_loads": False},
                                     {"short_chain": True, "top4": True}, {"short_chain": True, "top4": False},
                                     {"short_chain": True, "top4": False, "pair_union": True},
                                     {"short_chain": True, "top4": False, "pair_union": False},
                                     {"max_registers": 72}, {"pad_reload": True}, {"flat_loads": True},
                                     {"flat_loads": True, "early_flag": True, "skip_padded_loads": False},
                                     {"flat_loads": True, "bf16_pairs": True}, {"bf16_pairs": True, "top4": True},
                                     {"flat_loads": True, "bf16_pairs": True, "pad_reload": True}],
                         ids=["long_chain", "short_chain", "early_flag", "top4", "top8", "pair_union",
                              "no_pair_union", "max_registers_72", "pad_reload", "flat_loads", "flat_early_flag",
                              "flat_bf16_pairs", "bf16_pairs_top4", "flat_bf16_pairs_reload"])
def test_gpu_regs_variants_match_reference(E, G, TG, K, scale, T, dtype, variant):
    """The "regs" variants benchmarks/kernel_ab.py and mask_cost.py time against the served build
    (the long and the short chain, each forced; the flag loaded early; lanes keeping their 4 best,
    with the threshold by pairs of lanes and the write split, or their 8, forced; the union of
    8-lists by pairs of lanes or by a butterfly, forced; a register cap of 72; the flag loaded again
    for the writes; the logits loaded lane-fastest, alone and with the early flag; bf16 converted
    two a register, with them, with top4's fallback and with the flag reloaded), at the sizes they
    time, with a bias and a mask; integer logits (ties everywhere, so top4's fallback) too."""
    _regs_matches_reference(E, G, TG, K, scale, T, dtype, T + E + 3, **variant)


def _regs_matches_reference(E, G, TG, K, scale, T, dtype, seed, **launch):
    """``fused_grouped_topk(**launch)`` on random logits with a bias and 30 % padded rows (every
    output written, padded rows (-1, 0), the reference's sets up to near ties), then on integer
    logits with ties everywhere (the reference's sets exactly)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, E, generator=g, device="cuda").to(dtype)
    b = torch.randn(E, generator=g, device="cuda") * 0.05
    mask = torch.rand(T + 7, generator=g, device="cuda") < 0.3
    kw = dict(topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=scale, is_padding=mask)
    out = (torch.full((T, K), float("nan"), device="cuda"), torch.full((T, K), -7, dtype=torch.int32, device="cuda"))
    fw, fi = fused_grouped_topk(x, b, out=out, **kw, **launch)
    rw, ri = grouped_topk_reference(x, b, **kw)
    pad = mask[:T]
    assert (fi[pad] == -1).all() and (fw[pad] == 0).all()
    assert (fi != -7).all() and torch.isfinite(fw).all()
    choice = x.float().sigmoid() + b
    same_routing_up_to_near_ties(fw[~pad], fi[~pad], rw[~pad], ri[~pad], choice[~pad], G, TG, K)
    xi = torch.randint(-2, 3, (T, E), generator=g, device="cuda").to(dtype)
    bi = torch.full((E,), 0.25, device="cuda")
    kw.pop("is_padding")
    fw, fi = fused_grouped_topk(xi, bi, **kw, **launch)
    same_routing(fw, fi, *grouped_topk_reference(xi, bi, **kw))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("E,G,TG,K,scale", ROUTERS)
@pytest.mark.parametrize("kernel,block_m,num_warps", [("tile", 1, 1), ("tile", 2, 1), ("tile", 4, 1), ("tile", 2, 2),
                                                     ("tile", 4, 2), ("tile", 8, 2), ("tile", 8, 4), ("tile", 16, 4),
                                                     ("rows", 0, 1), ("rows", 0, 4), ("parts", 0, 1), ("parts", 0, 4),
                                                     ("regs", 4, 1), ("regs", 8, 2)])
@pytest.mark.parametrize("merge", [True, False])
def test_gpu_fused_grouped_topk_ties_lowest_id(E, G, TG, K, scale, kernel, block_m, num_warps, merge):
    """Integer logits tie everywhere: the exact (lowest-id) path must give the reference's sets."""
    if kernel in ("tile", "regs") and not merge:
        pytest.skip("merge is a rows / parts option")
    g = torch.Generator(device="cuda").manual_seed(E + block_m)
    x = torch.randint(-2, 3, (515, E), generator=g, device="cuda").to(torch.bfloat16)
    for b in (None, torch.full((E,), 0.25, device="cuda")):
        kw = dict(topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=scale)
        fw, fi = fused_grouped_topk(x, b, kernel=kernel, block_m=block_m or None, num_warps=num_warps,
                                    merge=merge, **kw)
        rw, ri = grouped_topk_reference(x, b, **kw)
        same_routing(fw, fi, rw, ri)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kernel,block_m,num_warps", [("tile", 1, 1), ("tile", 2, 1), ("tile", 4, 1), ("tile", 2, 2),
                                                     ("tile", 4, 2), ("tile", 8, 2), ("tile", 8, 4), ("tile", 16, 4),
                                                     ("tile", 16, 8), ("rows", 0, 1), ("rows", 0, 2), ("rows", 0, 4),
                                                     ("rows", 0, 8), ("parts", 0, 1), ("parts", 0, 2), ("parts", 0, 4),
                                                     ("parts", 0, 8)])
@pytest.mark.parametrize("skip_padded_loads", [False, True])
def test_gpu_fused_grouped_topk_configs(kernel, block_m, num_warps, skip_padded_loads):
    x = torch.randn(333, 256, device="cuda")
    b = torch.randn(256, device="cuda") * 0.05
    mask = torch.rand(340, device="cuda") < 0.3
    kw = dict(topk=8, num_expert_group=8, topk_group=4, routed_scaling_factor=2.5, is_padding=mask)
    fw, fi = fused_grouped_topk(x, b, kernel=kernel, block_m=block_m or None, num_warps=num_warps,
                                skip_padded_loads=skip_padded_loads, **kw)
    rw, ri = grouped_topk_reference(x, b, **kw)
    same_routing(fw, fi, rw, ri)
    assert (fi[mask[:333]] == -1).all() and (fw[mask[:333]] == 0).all()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kernel", ["tile", "rows", "parts", "regs"])
def test_gpu_fused_grouped_topk_in_cuda_graph(kernel):
    T = 256
    x = torch.randn(T, 256, device="cuda")
    b = torch.randn(256, device="cuda") * 0.05
    mask = torch.zeros(T, dtype=torch.bool, device="cuda")
    out = (torch.empty(T, 8, device="cuda"), torch.empty(T, 8, dtype=torch.int32, device="cuda"))
    kw = dict(topk=8, num_expert_group=8, topk_group=4, routed_scaling_factor=2.5, kernel=kernel)
    fused_grouped_topk(x, b, is_padding=mask, out=out, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_grouped_topk(x, b, is_padding=mask, out=out, **kw)
    x.copy_(torch.randn(T, 256, device="cuda"))
    mask.copy_(torch.rand(T, device="cuda") < 0.5)
    graph.replay()
    kw.pop("kernel")
    rw, ri = grouped_topk_reference(x, b, is_padding=mask, **kw)
    same_routing(out[0], out[1], rw, ri)


@pytest.mark.vllm
@pytest.mark.parametrize("E,G,TG,K,scale", ROUTERS)
@pytest.mark.parametrize("bias", [True, False])
def test_reference_matches_installed_vllm_grouped_topk(E, G, TG, K, scale, bias):
    """Our torch reference == vLLM's own (unfused, eager) grouped_topk on the installed vLLM."""
    mod = pytest.importorskip("vllm.model_executor.layers.fused_moe.router.grouped_topk_router")
    upstream = getattr(mod.grouped_topk, "_torchdynamo_orig_callable", mod.grouped_topk)  # skip torch.compile
    g = torch.Generator().manual_seed(E + bias)
    x = torch.randn(64, E, generator=g)
    b = torch.randn(E, generator=g) * 0.05 if bias else None
    uw, ui = upstream(torch.empty(64, 16), x, K, True, G, TG, "sigmoid", scale, b)
    rw, ri = grouped_topk_reference(x, b, topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=scale)
    assert ui.dtype == ri.dtype and uw.dtype == rw.dtype
    same_routing(rw, ri, uw, ui, atol=1e-6)


def test_benchmark_loads_vllm_grouped_topk_from_release_sources():
    """benchmarks/vllm_grouped_topk.py: vLLM's own function (from the release's sources, with
    its decorator; eager backend here) routes like the reference on random fp32 logits."""
    rel = os.environ.get("PADPLUGIN_RELEASES_DIR")
    src = os.path.join(rel or "", "0.32.0")
    if not rel or not os.path.isdir(src):
        pytest.skip("PADPLUGIN_RELEASES_DIR/0.32.0 not present")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import vllm_grouped_topk
    finally:
        sys.path.pop(0)
    fn, desc = vllm_grouped_topk.load(src, compile_backend="eager")
    assert "dynamic=True" in desc
    g = torch.Generator().manual_seed(3)
    for E, G, TG, K, scale in ROUTERS:
        x = torch.randn(40, E, generator=g)
        b = torch.randn(E, generator=g) * 0.05
        uw, ui = fn(torch.empty(40, 4), x, K, True, G, TG, "sigmoid", scale, b)
        rw, ri = grouped_topk_reference(x, b, topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=scale)
        same_routing(rw, ri, uw, ui, atol=1e-6)
