"""Launches to profile under Nsight Compute: the fused grouped top-k without mask, with
the mask (25 % of rows padded) and with the mask but no row padded, per size and dtype.

    ncu --clock-control none -k regex:_grouped_topk \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,gpu__time_duration.sum \
        python3 benchmarks/profile_grouped_topk.py [--kernel tile|rows] [--num-warps N] [--short-chain] [--keep-padded-loads]

Launch order (ncu lists them in this order): for each (router, dtype, T) in CASES:
no mask, mask 25 %, mask none padded.  The kernel reads 1 byte per token more with the
mask, and padded rows skip their logits ("regs" above 4096 tokens); what else the mask costs shows
as executed instructions.

``--sass`` (no GPU needed, Triton installed): compiles the three kernels for sm_90 the way a
launch specialises them (pointers and the int arguments divisible by 16) and prints per
(kernel, router, dtype) the static SASS instruction count, registers, and each loop's body
length (cuobjdump from Triton's package): per-token dynamic counts = straight-line code +
body x trip count (S / 16-byte chunk), per thread, x lanes per token / 32 for warp
instructions.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk  # noqa: E402

CASES = [("deepseek-v3", torch.float32, 32768), ("deepseek-v3", torch.bfloat16, 32768),
         ("deepseek-v3", torch.float32, 4096), ("kimi-style", torch.float32, 32768),
         ("deepseek-v3", torch.float32, 1024)]  # (appended 2026-12-06: earlier ncu logs list the first four)
ROUTER = {"deepseek-v3": (256, 8, 4, 8, 2.5), "kimi-style": (384, 1, 1, 8, 2.827)}


def sass_stats(kernels=None, routers=None):
    """Per (kernel variant, router, dtype) compiled for sm_90 as a launch specialises it: yields
    dicts of name, router, dtype, instructions, registers, stack (bytes: spills), loops (bodies'
    lengths).  ``kernels`` / ``routers``: only these names."""
    import inspect
    import os
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vllm_padplugin.kernels import triton_grouped_topk as m

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    div16 = ("logits_ptr", "bias_ptr", "pad_ptr", "w_out_ptr", "ids_out_ptr", "T", "stride_t")
    for router, (E, G, TG, K, _) in ROUTER.items():
        if routers is not None and router not in routers:
            continue
        S = E // G
        for dt, vec in (("fp32", 4), ("bf16", 8)):
            common = dict(G=G, S=S, TOPK_GROUP=TG, TOPK=K, HAS_BIAS=True, HAS_PAD=False, RENORM=True,
                          SKIP_PADDED_LOADS=False, BLOCK_K=8)
            fast = dict(VEC=vec, FAST_SIGMOID=True, MERGE=True, LOG_TOPK=3)
            lanes = m._parts_lanes(E, G, TG, vec)
            lpg = lanes // TG if G > TG else 0
            variants = {
                "tile": (m._grouped_topk_kernel, dict(common, BLOCK_M=1, BLOCK_G=triton.next_power_of_2(G),
                                                      BLOCK_S=max(4, triton.next_power_of_2(S)))),
                "rows": (m._grouped_topk_rows_kernel, dict(common, BLOCK_M=32, **fast)),
                "parts": (m._grouped_topk_parts_kernel, dict(common, BLOCK_M=32 // lanes, P=lanes, SP=E // lanes,
                                                             LPG=lpg, **fast)),
            }
            rl = m._regs_lanes(E, G, TG, K, vec)
            for p in [rl] + [w for w in (16, 32) if w != rl and m._regs_lanes(E, G, TG, K, vec, w) == w]:
                if not p:
                    continue
                at = "" if p == rl else f"@{p}"  # the default lanes, or more of them (small batches)
                base = dict(common, BLOCK_M=32 // p, P=p, SP=E // p, LPG=0, **fast)
                if p == rl:
                    variants["regs"] = (m._grouped_topk_regs_kernel, base)
                masked = dict(base, HAS_PAD=True, SKIP_PADDED_LOADS=True)
                variants["regs+mask" + at] = (m._grouped_topk_regs_kernel, masked)
                # "regs+mask" is the long chain; "+short" is served where short_chain_served says so;
                variants["regs+mask+short" + at] = (m._grouped_topk_regs_kernel, dict(masked, SHORT_CHAIN=True))
                # lanes keep their 4 best, the threshold by pairs of lanes, the write split (as
                # fused_grouped_topk launches top4: served from 4096 tokens where top4_served says so)
                variants["regs+mask+short+top4" + at] = (m._grouped_topk_regs_kernel,
                                                         dict(masked, SHORT_CHAIN=True, TOP4=True))
                # the lanes' 8-lists by pairs of lanes (served where pair_union_served says so)
                variants["regs+mask+short+pairs" + at] = (m._grouped_topk_regs_kernel,
                                                          dict(masked, SHORT_CHAIN=True, PAIRS=True))
                # the pairs' build with the flag loaded again for the writes (pad_reload)
                variants["regs+mask+short+pairs+reload" + at] = (m._grouped_topk_regs_kernel,
                                                                 dict(masked, SHORT_CHAIN=True, PAIRS=True,
                                                                      PAD_RELOAD=True))
                if dt == "bf16":  # and with the logits loaded lane-fastest, converted two a register
                    variants["regs+mask+short+pairs+flat+bf16pairs+reload" + at] = (
                        m._grouped_topk_regs_kernel, dict(masked, SHORT_CHAIN=True, PAIRS=True, PAD_RELOAD=True,
                                                          FLAT=True, BF16_PAIRS=True))
                # the same three served builds without the mask: what the mask changes in them; each,
                # masked or not, also with its logits loaded lane-fastest (flat_loads) and, 16-bit, then
                # converted two a register (bf16_pairs)
                for v, kw in (("", {}), ("+top4", {"TOP4": True}), ("+pairs", {"PAIRS": True})):
                    variants["regs+short" + v + at] = (m._grouped_topk_regs_kernel, {**base, "SHORT_CHAIN": True, **kw})
                    for mk, b in (("", base), ("+mask", masked)):
                        flat = {**b, "SHORT_CHAIN": True, **kw, "FLAT": True}
                        variants["regs" + mk + "+short" + v + "+flat" + at] = (m._grouped_topk_regs_kernel, flat)
                        if dt == "bf16":
                            variants["regs" + mk + "+short" + v + "+flat+bf16pairs" + at] = (
                                m._grouped_topk_regs_kernel, {**flat, "BF16_PAIRS": True})
                # padded rows load their logits ("regs": served up to 4096 tokens), the flag's load sunk or early
                for e in ("", "+early"):
                    variants["regs+mask+short+loads" + e + at] = (m._grouped_topk_regs_kernel, dict(
                        masked, SHORT_CHAIN=True, SKIP_PADDED_LOADS=False, EARLY_FLAG=bool(e)))
            for name, (fn, ce) in variants.items():
                if kernels is not None and name not in kernels:
                    continue
                sig = {a: "constexpr" for a in fn.arg_names}
                sig.update({"logits_ptr": f"*{dt}", "bias_ptr": "*fp32", "pad_ptr": "*u8", "w_out_ptr": "*fp32",
                            "ids_out_ptr": "*i32", "T": "i32", "stride_t": "i32", "pad_stride": "i32",
                            "scale": "fp32"})
                names = list(sig)
                attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in div16}
                consts = {p.name: p.default for p in fn.params
                          if p.is_constexpr and p.default is not inspect.Parameter.empty}
                consts.update({k: v for k, v in ce.items() if k in sig})
                src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
                opts = {"num_warps": 1}
                if name.startswith("regs"):  # the cap fused_grouped_topk launches it with
                    opts.update(m._regs_cap(ce["SP"]))
                k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(k.asm["cubin"])
                    f.flush()
                    sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
                    res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
                ins = sass_instructions(sass)
                loops = [(int(t, 16), int(pc, 16)) for pc, t in re.findall(r"/\*([0-9a-f]{4})\*/\s+@!?P\d BRA 0x([0-9a-f]+)", sass)
                         if int(t, 16) < int(pc, 16)]
                regs = re.search(r"REG:(\d+)", res)
                stack = re.search(r"STACK:(\d+)", res)
                yield {"name": name, "router": router, "dtype": dt, "instructions": len(ins),
                       "flag_load": first_at(ins, "LDG.E.U8"), "first_sigmoid": first_at(ins, "MUFU.EX2"),
                       "common_path": common_path(ins) if name.startswith("regs") else None,
                       "late_loads": late_loads(ins) if name.startswith("regs") else None,
                       "registers": int(regs.group(1)) if regs else None, "stack": int(stack.group(1)) if stack else None,
                       "loops": [(b - a) // 16 + 1 for a, b in loops], "options": opts,
                       "shuffles": sum(t.startswith("SHFL") for _, t in ins),
                       "wide_loads": sum(bool(re.match(r"(@!?P\d+ )?LDG\.E\.(64|128) ", t)) for _, t in ins)}


def sass_instructions(sass: str) -> list[tuple[str, str]]:
    """cuobjdump's SASS listing -> (address in hex, instruction text) per instruction, in order."""
    import re

    return re.findall(r"^\s+/\*([0-9a-f]{4})\*/\s+(.*?)\s*;", sass, re.MULTILINE)


def first_at(ins: list[tuple[str, str]], op: str) -> int | None:
    """Index of the first of ``sass_instructions`` containing ``op`` (None: none does)."""
    return next((i for i, (_, t) in enumerate(ins) if op in t), None)


def late_loads(ins: list[tuple[str, str]]) -> int:
    """Masked 8- or 16-byte loads (a "regs" lane's logits; its bias loads are unmasked) that ptxas
    issues after the first sigmoid and before the block-wide tie test (``REDUX``; the reloads of a
    fallback path come after it): logits whose DRAM latency is no longer hidden behind the others'."""
    import re

    ex2 = first_at(ins, "MUFU.EX2")
    end = first_at(ins, "REDUX") or len(ins)
    return sum(1 for i, (_, t) in enumerate(ins) if ex2 < i < end and re.match(r"@!?P\d+ LDG\.E\.(64|128) ", t))


def common_path(ins: list[tuple[str, str]]) -> int | None:
    """Instructions a "regs" thread executes when no row of its block has a tie at its threshold:
    those up to the last exit less the tie path, i.e. the longer of the two regions the branch
    after the block-wide tie test (``REDUX``) chooses between, or, where each ends in its own exit,
    the shorter (straight-line code: a loop body, Kimi-style's pop loop, counts once).  None where
    the SASS has no such branch."""
    import re

    idx = lambda a: int(a, 16) // 16  # noqa: E731 - SASS instructions are 16 bytes apart
    r = next((i for i, (_, t) in enumerate(ins) if t.startswith("REDUX")), None)
    b = next((i for i in range(r, len(ins)) if " BRA " in f" {ins[i][1]} "), None) if r is not None else None
    if b is None or not ins[b][1].startswith("@"):
        return None
    tgt = idx(re.search(r"BRA (0x[0-9a-f]+)", ins[b][1]).group(1))
    end = max(i for i, (_, t) in enumerate(ins) if "EXIT" in t) + 1
    skipped = tgt - b - 1  # fall-through region
    last = ins[tgt - 1][1]
    if last.startswith("EXIT"):  # each branch runs to its own exit (the writes split): the shorter
        return b + 1 + min(skipped, end - tgt)
    if last.startswith("BRA "):  # if / else: the fall-through region jumps over the other one
        skipped = max(skipped, idx(re.search(r"BRA (0x[0-9a-f]+)", last).group(1)) - tgt)
    return end - skipped


def sass_counts() -> None:
    for r in sass_stats():
        cp = f"common path {r['common_path']}, " if r["common_path"] else ""
        cp += f"{r['late_loads']} late logits loads, " if r["late_loads"] is not None else ""
        print(f"{r['name']:22} {r['router']:11} {r['dtype']}: {cp}{r['instructions']} SASS instructions, "
              f"{r['shuffles']} shuffles, {r['registers']} registers, {r['stack']} B stack, loop bodies {r['loops']}")


def _launch_kwargs(text: str) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_masking import parse_kwargs

    return parse_kwargs(text)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default=None)
    ap.add_argument("--num-warps", type=int, default=None)
    ap.add_argument("--short-chain", dest="short_chain", action="store_const", const=True, default=None,
                    help="launch regs' short_chain build at every size (default: where it is served)")
    ap.add_argument("--long-chain", dest="short_chain", action="store_const", const=False,
                    help="launch regs' long-chain build (served before 2026-12-06)")
    ap.add_argument("--keep-padded-loads", action="store_true",
                    help="masked launches load padded rows' logits too (skip_padded_loads=False): no load waits for the flag")
    ap.add_argument("--launch", type=_launch_kwargs, default={}, metavar="KEY=VALUE,...",
                    help="more fused_grouped_topk keyword arguments, e.g. flat_loads=True (gpu_masking.parse_kwargs)")
    ap.add_argument("--sass", action="store_true", help="static SASS counts, no GPU (see the docstring)")
    args = ap.parse_args()
    if args.sass:
        sass_counts()
        return
    g = torch.Generator(device="cuda").manual_seed(0)
    for router, dtype, T in CASES:
        E, G, TG, K, scale = ROUTER[router]
        x = torch.randn(T, E, generator=g, device="cuda").to(dtype)
        b = torch.randn(E, generator=g, device="cuda") * 0.05
        mask = torch.zeros(T, dtype=torch.bool, device="cuda")
        mask[T - T // 4:] = True
        none = torch.zeros_like(mask)
        kw = dict(topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=scale,
                  kernel=args.kernel, num_warps=args.num_warps, short_chain=args.short_chain,
                  skip_padded_loads=False if args.keep_padded_loads else None) | args.launch
        for m in (None, mask, none):
            fused_grouped_topk(x, b, is_padding=m, **kw)
        torch.cuda.synchronize()
        print(router, dtype, T, "launched: no mask, mask 25 %, mask none padded", flush=True)


if __name__ == "__main__":
    main()
