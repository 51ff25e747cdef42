"""GPU benchmark: padding mask and fused grouped top-k under CUDA-graph replay, against the
bandwidth limit and against vLLM's own grouped top-k, in one run (H200).

Per MoE layer call, in µs, median of repeats; each op is captured many times into one
CUDA graph so the replay amortises launch cost the way a captured decode step does.
Calls inside one graph cycle through several input sets whose total is > 3x the L2, so
large batches read their logits from HBM, not from the cache of the previous call.

  mask:   (i) upstream's pair of out-of-place ``masked_fill`` (vLLM >= 0.31 router),
          (ii) the same pair in place (``masked_fill_``), (iii) our one-launch Triton kernel.
  route:  the fused Triton kernel without / with the padding mask, the bandwidth limit,
          a device copy of the same bytes, and vLLM's own ``grouped_topk`` (its Python/torch
          function read from the release sources and compiled with vLLM's own
          ``@torch.compile`` decorator; see ``benchmarks/vllm_grouped_topk.py``), + upstream's
          mask pair.

limit = bytes the kernel must move (logits read once, ids + weights written, + 1 byte per
token for the mask) / the device-to-device copy bandwidth measured at the start of the run
(a 2 GiB copy, bytes read + written).  ratio = fused / limit.

Routing: DeepSeek-V3 (256 experts / 8 groups / top-4 groups / top-8, sigmoid + correction
bias) and Kimi-style (384 / 1 / 1 / 8, with bias), float32 and bfloat16 logits.  Before
timing each case the script checks the kernel against the torch reference (same id set
per row; weights per id within 1e-5; rows that differ must be near-ties, see
``tests/test_triton_kernels.py``) and exits 1 on a mismatch.

    python benchmarks/gpu_masking.py --vllm-src .vllm_src/vllm-0.32.0-grouped_topk.tar.xz \
        --tune --json gpu_masking.json --plot gpu_masking.png

``--tune`` times every entry of SWEEP (kernel, block, warps) per case, each checked against the
reference first, and the full table then uses the fastest correct one (the committed
``default_config`` is set from such a run).  ``--launch KEY=VALUE,...`` gives every fused launch
more ``fused_grouped_topk`` keyword arguments: the table of an experiment as if it were served,
before it is (e.g. ``--launch pair_union=True,top4=False``); the JSON records them.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_padplugin.kernels.reference import decision_margin, grouped_topk_reference  # noqa: E402
from vllm_padplugin.kernels.triton_grouped_topk import default_config, fused_grouped_topk  # noqa: E402
from vllm_padplugin.kernels.triton_mask import mask_padded_routes_inplace  # noqa: E402

TOKENS = (16, 64, 256, 1024, 4096, 16384, 32768)
K = 8
PAD_FRACTION = 0.25
ROUTERS = {
    "deepseek-v3": dict(num_experts=256, num_expert_group=8, topk_group=4, topk=8, scale=2.5),
    "kimi-style": dict(num_experts=384, num_expert_group=1, topk_group=1, topk=8, scale=2.827),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# (kernel, BLOCK_M, num_warps, merge): "tile" = one warp per token (a 2-warp row or tile, or
# 2-4 tokens per warp, lost everywhere in the earlier H200 sweeps); "rows" = one thread per
# token (BLOCK_M = 32 x num_warps; 1, 2 and 8 warps and insertion instead of merge lost to 4
# warps with merge in gpu_masking_h200_sweep1.json); "parts" = 8 lanes per token (BLOCK_M =
# 32 x num_warps / 8); merge = sort-and-merge (else insertion) for the k best.
# "regs" BLOCK_M = 32 x num_warps / lanes per token: ("regs", 1, 1) = 32 lanes, ("regs", 2, 1) = 16.
SWEEP = (("tile", 1, 1, None), ("rows", 128, 4, True), ("parts", 4, 1, True), ("parts", 8, 2, True),
         ("parts", 16, 4, True), ("regs", 4, 1, True), ("regs", 8, 2, True), ("regs", 16, 4, True),
         ("regs", 1, 1, True), ("regs", 2, 1, True))
ROTATE_BYTES = 200e6  # input sets per graph: > 3x the H200's 60 MB L2


def capture_graph(fns, *, target_ms: float = 5.0, max_inner: int = 200) -> tuple[torch.cuda.CUDAGraph, int]:
    """One CUDA graph of ``inner`` calls of ``fns`` (a callable or a list, called in turn),
    ``inner`` sized so a replay takes about ``target_ms``; warmed up, ready to replay."""
    fns = fns if isinstance(fns, (list, tuple)) else [fns]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns[:3] * 2:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(5):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    est_ms = (time.perf_counter() - t0) / 5 * 1e3
    inner = int(max(5, min(max_inner, target_ms / max(est_ms, 1e-3))))
    inner = max(inner, min(len(fns), max_inner))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(inner):
            fns[i % len(fns)]()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    return g, inner


def replay_us(g: torch.cuda.CUDAGraph, inner: int) -> float:
    """µs per captured call of one replay of ``g``, timed with CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / inner


def graph_time_us(fns, *, target_ms: float = 5.0, repeats: int = 9, max_inner: int = 200) -> dict:
    """µs per call under CUDA-graph replay; ``fns`` (a callable or a list of them, called in turn)."""
    fns = fns if isinstance(fns, (list, tuple)) else [fns]
    g, inner = capture_graph(fns, target_ms=target_ms, max_inner=max_inner)
    times = sorted(replay_us(g, inner) for _ in range(repeats))
    del g
    return {"median_us": statistics.median(times), "min_us": times[0], "max_us": times[-1],
            "calls_per_graph": inner, "input_sets": len(fns), "repeats": repeats}


def copy_bandwidth(dev: str) -> dict:
    """Device-to-device copy of 2 GiB (bytes read + written per second), median of 20."""
    n = 1 << 29
    src = torch.randn(n, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    t = statistics.median(ts)
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": 2 * n * 4, "median_s": t, "GBps": 2 * n * 4 / t / 1e9}


def routing_inputs(T: int, num_experts: int, dtype, gen: torch.Generator, dev: str):
    logits = torch.randn(T, num_experts, generator=gen, device=dev).to(dtype)
    bias = torch.randn(num_experts, generator=gen, device=dev) * 0.05
    mask = torch.zeros(T + 128, dtype=torch.bool, device=dev)
    mask[T - int(T * PAD_FRACTION) : T] = True
    mask[T:] = torch.rand(128, generator=gen, device=dev) < 0.5  # beyond the batch: must be ignored
    return logits, bias, mask


def input_sets(logits: torch.Tensor, gen: torch.Generator) -> list[torch.Tensor]:
    """``logits`` and more random logits like it, ROTATE_BYTES in all (at most 64): a graph that
    cycles through them reads its logits from HBM, not from the L2."""
    n = max(1, min(64, math.ceil(ROTATE_BYTES / logits.nbytes)))
    return [logits] + [torch.randn(logits.shape, generator=gen, device=logits.device).to(logits.dtype)
                       for _ in range(n - 1)]


def route_kwargs(cfg: dict) -> dict:
    """``fused_grouped_topk`` / reference keyword arguments of a ROUTERS entry."""
    return dict(topk=cfg["topk"], num_expert_group=cfg["num_expert_group"], topk_group=cfg["topk_group"],
                renormalize=True, routed_scaling_factor=cfg["scale"])


def bench_mask(T: int, dev: str, gen: torch.Generator) -> dict:
    logits, bias, mask = routing_inputs(T, 256, torch.float32, gen, dev)
    w0, i0 = grouped_topk_reference(logits, bias, topk=K, num_expert_group=8, topk_group=4)
    w, i = w0.clone(), i0.clone()
    ref_w, ref_i = w0.masked_fill(mask[:T].unsqueeze(1), 0), i0.masked_fill(mask[:T].unsqueeze(1), -1)
    mask_padded_routes_inplace(w, i, mask)
    ok = torch.equal(i, ref_i) and torch.equal(w.view(torch.int32), ref_w.view(torch.int32))

    def upstream():
        p = mask[:T].unsqueeze(1)
        return w0.masked_fill(p, 0), i0.masked_fill(p, -1)

    wi, ii = w0.clone(), i0.clone()

    def inplace_pair():
        p = mask[:T].unsqueeze(1)
        wi.masked_fill_(p, 0)
        ii.masked_fill_(p, -1)

    wt, it = w0.clone(), i0.clone()

    def triton_kernel():
        mask_padded_routes_inplace(wt, it, mask, check=False)

    res = {"T": T, "k": K, "bit_identical": ok}
    for name, fn in (("upstream_pair", upstream), ("inplace_pair", inplace_pair), ("triton", triton_kernel)):
        res[name] = graph_time_us(fn)
    res["triton_over_upstream"] = res["triton"]["median_us"] / res["upstream_pair"]["median_us"]
    return res


def check_routing(fw, fi, rw, ri, choice, cfg=None, tie_eps: float = 2e-6) -> dict:
    """ids equal as sets per row; weights per id; differing rows must be near-ties: the
    reference's group or expert decision margin (``reference.decision_margin``) is below ``tie_eps``."""
    fs, fo = fi.long().sort(1)
    rs, ro = ri.long().sort(1)
    rows_equal = (fs == rs).all(1)
    wdiff = (fw.gather(1, fo) - rw.gather(1, ro)).abs()[rows_equal & (ri[:, 0] >= 0)]
    bad = ~rows_equal & (ri[:, 0] >= 0)
    near = 0
    if bad.any():
        if cfg is None:
            margin = torch.full((int(bad.sum()),), float("inf"), device=choice.device)
        else:
            margin = decision_margin(choice[bad], ri[bad], cfg["num_expert_group"], cfg["topk_group"], cfg["topk"])
        near = int((margin <= tie_eps).sum())
    return {"rows": int(fi.shape[0]), "rows_id_sets_differ": int(bad.sum()), "rows_differ_near_tie": near,
            "rows_differ_not_tie": int(bad.sum()) - near,
            "max_weight_abs_diff": float(wdiff.max()) if wdiff.numel() else 0.0}


def check_output(launch, out, rw, ri, choice, cfg, pad) -> dict:
    """Poison ``out`` (NaN / -7), ``launch()`` the kernel into it, then ``check_routing`` plus:
    padded rows exactly (-1, 0) and every element written."""
    out[0].fill_(float("nan"))
    out[1].fill_(-7)
    launch()
    c = check_routing(*out, rw, ri, choice, cfg)
    c["padded_rows_exact"] = bool((out[1][pad] == -1).all() and (out[0][pad] == 0).all())
    c["all_written"] = bool((out[1] != -7).all() and not out[0].isnan().any())
    return c


def output_ok(c: dict) -> bool:
    """A ``check_output`` result the tables may time: no row differs but by a near-tie."""
    return (c["padded_rows_exact"] and c["all_written"] and c["rows_differ_not_tie"] == 0
            and c["max_weight_abs_diff"] <= 1e-5)


def interleaved(router: str, dname: str, T: int, dev: str, gen: torch.Generator, variants: dict[str, dict],
                rounds: int, target_ms: float, base: str) -> dict:
    """Time ``variants`` (name -> ``fused_grouped_topk`` keyword arguments; ``padding``: None for no
    mask, "none" for a mask with no row padded, "pad25" for PAD_FRACTION padded) against one
    another: each checked against the reference (``check_output``), captured once into its own
    CUDA graph (over ``input_sets``), and the graphs replayed in ``rounds`` rounds, one replay each
    a round in a rotated order, so drift between rounds cancels in the per-round ratios.  Returns
    the checks, the median µs per variant, the per-round µs, and per variant its % against
    ``base``: the median of the per-round ratios with their 10th and 90th percentiles."""
    cfg = ROUTERS[router]
    E, k = cfg["num_experts"], cfg["topk"]
    logits, bias, mask = routing_inputs(T, E, DTYPES[dname], gen, dev)
    sets = input_sets(logits, gen)
    kw = route_kwargs(cfg)
    pads = {None: None, "none": torch.zeros_like(mask), "pad25": mask}
    calls = {name: {**{k: x for k, x in v.items() if k != "padding"}, "is_padding": pads[v.get("padding")]}
             for name, v in variants.items()}
    out = (torch.empty(T, k, device=dev), torch.empty(T, k, dtype=torch.int32, device=dev))
    choice = logits.float().sigmoid() + bias
    checks = {}
    for name, ex in calls.items():
        pad = ex["is_padding"][:T] if ex["is_padding"] is not None else torch.zeros(T, dtype=torch.bool, device=dev)
        rw, ri = grouped_topk_reference(logits, bias, is_padding=pad, **kw)
        checks[name] = check_output(lambda ex=ex: fused_grouped_topk(logits, bias, out=out, **kw, **ex),
                                    out, rw, ri, choice, cfg, pad)
    graphs = {name: capture_graph([lambda x=x, ex=ex: fused_grouped_topk(x, bias, out=out, **kw, **ex) for x in sets],
                                  target_ms=target_ms)
              for name, ex in calls.items()}
    names, nsets = list(variants), len(sets)
    us = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            us[name].append(replay_us(*graphs[name]))
    del graphs, sets
    kern, bm, nw = default_config(T, E, DTYPES[dname], num_expert_group=cfg["num_expert_group"],
                                  topk_group=cfg["topk_group"], topk=k)
    res = {"router": router, "dtype": dname, "T": T, "config": {"kernel": kern, "block_m": bm, "num_warps": nw},
           "rounds": rounds, "input_sets": nsets, "checks": checks,
           "us": {n: statistics.median(v) for n, v in us.items()}, "us_rounds": us,
           "bytes": logits.nbytes + T * k * 8}
    for name in names:
        if name != base:
            ratios = [100 * (a / b - 1) for a, b in zip(us[name], us[base])]
            dec = statistics.quantiles(ratios, n=10, method="inclusive")
            res[f"{name}_pct"] = {"median": statistics.median(ratios), "p10": dec[0], "p90": dec[-1]}
    return res


def interleaved_args(ap: argparse.ArgumentParser, tokens, rounds: int) -> argparse.Namespace:
    """The arguments of the scripts built on ``interleaved_cases``, parsed and checked."""
    ap.add_argument("--tokens", type=int, nargs="*", default=list(tokens))
    ap.add_argument("--dtypes", nargs="*", default=list(DTYPES))
    ap.add_argument("--routers", nargs="*", default=list(ROUTERS))
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--target-ms", type=float, default=2.0, help="about how long one replay of a graph takes")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    if args.rounds < 5:
        ap.error("--rounds: at least 5 (percentiles of fewer ratios mean little)")
    return args


def interleaved_doc(script: str, args, **fields):
    """``(generator, doc)`` for a run of ``script`` on this machine's GPU: the device, versions and
    ``args``' rounds in ``doc``, then ``fields``; None (and a line on stderr) without one."""
    if not torch.cuda.is_available():
        print(f"{script}: no CUDA device; nothing to measure", file=sys.stderr)
        return None
    import triton

    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rounds": args.rounds, "target_ms": args.target_ms, **fields, "cases": []}
    return torch.Generator(device="cuda").manual_seed(0), doc


def interleaved_cases(args, doc: dict, calls: dict[str, dict], base: str, dev: str, gen: torch.Generator,
                      per_case=None) -> None:
    """``interleaved`` for every router x dtype x T of ``args`` into ``doc["cases"]``; ``per_case(r)``
    adds columns; a progress line each, and ``args.json`` rewritten after each case, so a later
    failure loses no measurement."""
    for router in args.routers:
        for dname in args.dtypes:
            for T in args.tokens:
                t0 = time.perf_counter()
                r = interleaved(router, dname, T, dev, gen, calls, args.rounds, args.target_ms, base)
                if per_case:
                    per_case(r)
                doc["cases"].append(r)
                print(f"  {router} {dname} T={T}: {base} {r['us'][base]:.2f} µs, "
                      + ", ".join(f"{n} {r[f'{n}_pct']['median']:+.2f} %" for n in calls if n != base)
                      + f" [{time.perf_counter() - t0:.1f} s]", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(doc, indent=1))


def mismatch_status(doc: dict) -> int:
    """1 (and the cases on stderr) if a variant's output failed its check, else 0."""
    bad = [(r["router"], r["dtype"], r["T"], n) for r in doc["cases"] for n, c in r["checks"].items()
           if not output_ok(c)]
    if bad:
        print(f"MISMATCH: {bad}", file=sys.stderr)
        return 1
    return 0


def pct_cell(p: dict) -> str:
    """An ``interleaved`` % as a table cell: median [10th, 90th percentile]."""
    return f" {p['median']:>+6.2f} [{p['p10']:>+5.1f},{p['p90']:>+5.1f}]"


def plot_pct(doc: dict, path: str, series, *, ylabel: str, title: str, band=None) -> None:
    """One panel per router of ``doc["cases"]`` (``interleaved`` results): each (name, colour) of
    ``series`` as its % against the base over T, median with 10th-90th percentile bars, fp32
    solid and bf16 dashed; ``band`` = (low, high, label) shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routers = sorted({r["router"] for r in doc["cases"]})
    fig, axes = plt.subplots(1, len(routers), figsize=(6.5 * len(routers), 4.6), squeeze=False)
    for a, router in zip(axes[0], routers):
        for dname, ls in (("fp32", "-"), ("bf16", "--")):
            rows = [r for r in doc["cases"] if r["router"] == router and r["dtype"] == dname]
            if not rows:
                continue
            Ts = [r["T"] for r in rows]
            for name, color in series:
                med = [r[f"{name}_pct"]["median"] for r in rows]
                lo = [m - r[f"{name}_pct"]["p10"] for m, r in zip(med, rows)]
                hi = [r[f"{name}_pct"]["p90"] - m for m, r in zip(med, rows)]
                a.errorbar(Ts, med, yerr=[lo, hi], ls=ls, color=color, marker="o", capsize=3,
                           label=f"{name} {dname}")
        if band:
            a.axhspan(band[0], band[1], color="green", alpha=0.1, label=band[2])
        a.axhline(0, color="black", lw=0.8)
        a.set(xscale="log", xlabel="tokens T", ylabel=ylabel, title=f"{title}, {router}")
        a.legend(fontsize=7)
    fig.suptitle(f"{doc['device']}: median of {doc['rounds']} interleaved rounds, bars 10th-90th percentile")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_kwargs(text: str) -> dict:
    """``"top4=True,block_m=2"`` -> ``{"top4": True, "block_m": 2}``: ``fused_grouped_topk`` keyword
    arguments the benchmark leaves to the kernel's defaults (not the router's, the mask or ``out``),
    values Python literals; anything else an ``argparse.ArgumentTypeError`` naming it."""
    params = inspect.signature(fused_grouped_topk).parameters
    set_here = {"topk", "num_expert_group", "topk_group", "renormalize", "routed_scaling_factor", "is_padding", "out"}
    known = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY} - set_here
    kw = {}
    for item in filter(None, text.split(",")):
        key, eq, value = (x.strip() for x in item.partition("="))
        try:
            kw[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise argparse.ArgumentTypeError(f"{item!r}: want KEY=<Python literal>") from None
        if not (eq and key.isidentifier()):
            raise argparse.ArgumentTypeError(f"{item!r}: want KEY=<Python literal>")
        if key not in known:
            raise argparse.ArgumentTypeError(f"{key!r}: not one of fused_grouped_topk's launch options "
                                             f"{sorted(known)}")
    return kw


def bench_route(router: str, dname: str, T: int, dev: str, gen: torch.Generator, bw: float,
                vllm_fn, sweep: tuple, launch: dict | None = None) -> dict:
    cfg = ROUTERS[router]
    dtype = DTYPES[dname]
    E, k = cfg["num_experts"], cfg["topk"]
    logits, bias, mask = routing_inputs(T, E, dtype, gen, dev)
    kw = route_kwargs(cfg)
    sets = input_sets(logits, gen)
    nsets = len(sets)
    rw, ri = grouped_topk_reference(logits, bias, is_padding=mask[:T], **kw)
    choice = logits.float().sigmoid() + bias
    out = (torch.full((T, k), float("nan"), device=dev), torch.full((T, k), -7, dtype=torch.int32, device=dev))
    no_pad = torch.zeros_like(mask)  # the mask present but nothing padded: the mask's pure cost

    res = {"router": router, "dtype": dname, "T": T, "input_sets": nsets}
    kern, bm, nw = default_config(T, E, dtype, num_expert_group=cfg["num_expert_group"],
                                  topk_group=cfg["topk_group"], topk=k)
    merge = None
    if sweep:
        res["sweep"] = []
        for skern, sbm, snw, smerge in sweep:
            skw = dict(kw, kernel=skern, block_m=sbm, num_warps=snw, merge=smerge, **(launch or {}))
            entry = {"kernel": skern, "block_m": sbm, "num_warps": snw, "merge": smerge}
            try:
                chk = check_output(lambda: fused_grouped_topk(logits, bias, is_padding=mask, out=out, **skw),
                                   out, rw, ri, choice, cfg, mask[:T])
                t = graph_time_us([lambda x=x: fused_grouped_topk(x, bias, out=out, **skw) for x in sets],
                                  target_ms=3, repeats=5)
                res["sweep"].append(dict(entry, us=t["median_us"], check=chk))
            except Exception as exc:  # a config Triton cannot build: record, keep going
                res["sweep"].append(dict(entry, error=repr(exc)[:300]))
        ok = [s for s in res["sweep"] if "us" in s and output_ok(s["check"])]
        best = min(ok, key=lambda s: s["us"])
        kern, bm, nw, merge = best["kernel"], best["block_m"], best["num_warps"], best["merge"]
    res["config"] = {"kernel": kern, "block_m": bm, "num_warps": nw, "merge": merge}
    fkw = dict(kw, kernel=kern, block_m=bm, num_warps=nw, merge=merge, **(launch or {}))

    res["check"] = check_output(lambda: fused_grouped_topk(logits, bias, is_padding=mask, out=out, **fkw),
                                out, rw, ri, choice, cfg, mask[:T])

    res["fused"] = graph_time_us([lambda x=x: fused_grouped_topk(x, bias, out=out, **fkw) for x in sets])
    res["fused_masked"] = graph_time_us(
        [lambda x=x: fused_grouped_topk(x, bias, is_padding=mask, out=out, **fkw) for x in sets])
    res["fused_masked_nopad"] = graph_time_us(
        [lambda x=x: fused_grouped_topk(x, bias, is_padding=no_pad, out=out, **fkw) for x in sets])
    # padded rows that load their logits anyway (no load waits on the mask), then the unmasked
    # kernel once more: how far two timings of the same launch differ (the noise of the ovh columns)
    lkw = dict(fkw, skip_padded_loads=False)
    res["fused_masked_loads"] = graph_time_us(
        [lambda x=x: fused_grouped_topk(x, bias, is_padding=mask, out=out, **lkw) for x in sets])
    res["fused_masked_nopad_loads"] = graph_time_us(
        [lambda x=x: fused_grouped_topk(x, bias, is_padding=no_pad, out=out, **lkw) for x in sets])
    res["fused_again"] = graph_time_us([lambda x=x: fused_grouped_topk(x, bias, out=out, **fkw) for x in sets])
    nbytes = logits.nbytes + T * k * 8
    res["bytes"] = nbytes
    res["limit_us"] = nbytes / bw * 1e6
    res["limit_masked_us"] = (nbytes + T) / bw * 1e6
    res["ratio"] = res["fused"]["median_us"] / res["limit_us"]
    res["ratio_masked"] = res["fused_masked"]["median_us"] / res["limit_masked_us"]
    csrc = [torch.empty(nbytes, dtype=torch.uint8, device=dev) for _ in range(min(nsets, 8))]
    cdst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    res["copy_same_bytes"] = graph_time_us([lambda c=c: cdst.copy_(c) for c in csrc])
    res["mask_overhead_pct"] = 100 * (res["fused_masked"]["median_us"] / res["fused"]["median_us"] - 1)
    res["mask_overhead_nopad_pct"] = 100 * (res["fused_masked_nopad"]["median_us"] / res["fused"]["median_us"] - 1)
    res["mask_overhead_loads_pct"] = 100 * (res["fused_masked_loads"]["median_us"] / res["fused"]["median_us"] - 1)
    res["mask_overhead_nopad_loads_pct"] = 100 * (res["fused_masked_nopad_loads"]["median_us"]
                                                  / res["fused"]["median_us"] - 1)
    res["repeat_pct"] = 100 * (res["fused_again"]["median_us"] / res["fused"]["median_us"] - 1)

    if vllm_fn is not None:
        hidden = torch.empty(T, 16, device=dev)
        vargs = (k, True, cfg["num_expert_group"], cfg["topk_group"], "sigmoid", cfg["scale"], bias)
        vw, vi = vllm_fn(hidden, logits, *vargs)
        res["vllm_check"] = check_routing(vw, vi, *grouped_topk_reference(logits, bias, **kw), choice, cfg)

        def vllm_masked(x):
            w, i = vllm_fn(hidden, x, *vargs)
            p = mask[:T].unsqueeze(1)
            return w.masked_fill(p, 0), i.masked_fill(p, -1)

        res["vllm"] = graph_time_us([lambda x=x: vllm_fn(hidden, x, *vargs) for x in sets])
        res["vllm_masked"] = graph_time_us([lambda x=x: vllm_masked(x) for x in sets])
        res["speedup_vs_vllm"] = res["vllm"]["median_us"] / res["fused"]["median_us"]
        res["speedup_vs_vllm_masked"] = res["vllm_masked"]["median_us"] / res["fused_masked"]["median_us"]
    del sets, csrc
    return res


def plot(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = 1 if doc["mask"] else 0  # no mask panel when the run skipped the mask table
    fig, ax = plt.subplots(1, 2 + first, figsize=(6 * (2 + first) - 1, 4.8))
    if first:
        Ts = [r["T"] for r in doc["mask"]]
        for key, label in (("upstream_pair", "upstream masked_fill pair"), ("inplace_pair", "in-place torch pair"),
                           ("triton", "Triton one-launch (ours)")):
            ax[0].plot(Ts, [r[key]["median_us"] for r in doc["mask"]], marker="o", label=label)
        ax[0].set(xscale="log", xlabel="tokens T (k=8)", ylabel="µs per MoE layer (graph replay)",
                  title="Padding mask", ylim=(0, None))
        ax[0].legend(fontsize=8)
    for j, router in enumerate(ROUTERS):
        a = ax[first + j]
        for dname, ls in (("fp32", "-"), ("bf16", "--")):
            rows = [r for r in doc["route"] if r["router"] == router and r["dtype"] == dname]
            if not rows:
                continue
            Ts = [r["T"] for r in rows]
            a.plot(Ts, [r["fused_masked"]["median_us"] for r in rows], ls, marker="s", label=f"fused + mask {dname}")
            a.plot(Ts, [r["limit_us"] for r in rows], ls, color="gray", label=f"bandwidth limit {dname}")
            if "vllm_masked" in rows[0]:
                a.plot(Ts, [r["vllm_masked"]["median_us"] for r in rows], ls, marker="o",
                       label=f"vLLM grouped_topk (compiled) + mask {dname}")
        a.set(xscale="log", yscale="log", xlabel="tokens T", ylabel="µs per MoE layer (graph replay)",
              title=f"Grouped top-k routing, {router}")
        a.legend(fontsize=7)
    fig.suptitle(f"{doc['device']}  (copy bandwidth {doc['copy_bandwidth']['GBps']:.0f} GB/s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_tables(doc: dict) -> None:
    print(f"\n{doc['device']}  torch {doc['torch']}  triton {doc['triton']}  copy bandwidth "
          f"{doc['copy_bandwidth']['GBps']:.0f} GB/s (µs per MoE layer call, CUDA-graph replay, median)"
          + (f"; every fused launch + {doc['launch']}" if doc.get("launch") else ""))
    print(f"{'T':>6} {'upstream pair':>14} {'in-place pair':>14} {'Triton':>8} {'Triton/upstream':>16} {'bit-identical':>14}")
    for r in doc["mask"]:
        print(f"{r['T']:>6} {r['upstream_pair']['median_us']:>14.2f} {r['inplace_pair']['median_us']:>14.2f} "
              f"{r['triton']['median_us']:>8.2f} {r['triton_over_upstream']:>16.2f} {str(r['bit_identical']):>14}")
    print("\nfused+mask: 25 % rows padded; +mask0: mask given, no row padded; limit = bytes / copy bandwidth;"
          " copy = device copy of the same bytes; vllm = vLLM grouped_topk compiled, + its mask pair;"
          " ovhL% / ovh0L%: the same with padded rows loading their logits; rep%: the unmasked kernel timed again")
    print(f"{'router':>11} {'dt':>4} {'T':>6} {'kernel,bm,nw':>13} {'fused':>7} {'limit':>6} {'ratio':>5} {'copy':>6} "
          f"{'+mask':>7} {'+mask0':>7} {'ovh%':>5} {'ovh0%':>5} {'vllm':>7} {'vllm+m':>7} {'x vllm':>6} "
          f"{'x(+m)':>6} {'differ':>6} {'ties':>4} {'max|dw|':>8} {'ovhL%':>5} {'ovh0L%':>6} {'rep%':>5}")
    for r in doc["route"]:
        v = r.get("vllm", {}).get("median_us", float("nan"))
        vm = r.get("vllm_masked", {}).get("median_us", float("nan"))
        c = r["config"]
        print(f"{r['router']:>11} {r['dtype']:>4} {r['T']:>6} {c['kernel']:>4},{c['block_m']:>3},{c['num_warps']:<2} "
              f"{r['fused']['median_us']:>7.2f} {r['limit_us']:>6.2f} {r['ratio']:>5.2f} "
              f"{r['copy_same_bytes']['median_us']:>6.2f} {r['fused_masked']['median_us']:>7.2f} "
              f"{r['fused_masked_nopad']['median_us']:>7.2f} {r['mask_overhead_pct']:>5.1f} "
              f"{r['mask_overhead_nopad_pct']:>5.1f} {v:>7.1f} {vm:>7.1f} {r.get('speedup_vs_vllm', float('nan')):>6.1f} "
              f"{r.get('speedup_vs_vllm_masked', float('nan')):>6.1f} {r['check']['rows_id_sets_differ']:>6} "
              f"{r['check']['rows_differ_near_tie']:>4} {r['check']['max_weight_abs_diff']:>8.1e} "
              f"{r['mask_overhead_loads_pct']:>5.1f} {r['mask_overhead_nopad_loads_pct']:>6.1f} {r['repeat_pct']:>5.1f}")
    for r in doc["route"]:
        if "sweep" in r:
            cells = " ".join(f"{s['kernel']}{s['num_warps']}{'m' if s['merge'] else ''}:{s['us']:.2f}"
                             f"{'' if s['check']['rows_differ_not_tie'] == 0 and s['check']['padded_rows_exact'] else '!BAD'}"
                             if "us" in s else f"{s['kernel']}{s['num_warps']}:ERR" for s in r["sweep"])
            print(f"sweep {r['router']} {r['dtype']} T={r['T']}: {cells}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    ap.add_argument("--dtypes", nargs="*", default=list(DTYPES))
    ap.add_argument("--routers", nargs="*", default=list(ROUTERS))
    ap.add_argument("--tune", action="store_true",
                    help="sweep SWEEP's (kernel, BLOCK_M, num_warps, merge) per case and time the best (else: default_config)")
    ap.add_argument("--sweep", nargs="*", default=None, metavar="KERNEL:BLOCK_M:WARPS",
                    help="with --tune: only these SWEEP entries (e.g. tile:1:1 regs:4:1); fewer compiles")
    ap.add_argument("--vllm-src", default=None,
                    help="vLLM release tree or .tar.xz (benchmarks/vllm_grouped_topk.py) to time vLLM's grouped_topk")
    ap.add_argument("--vllm-cases", nargs="*", default=None,
                    help="router:dtype pairs to time vLLM on (default all; each is one torch.compile)")
    ap.add_argument("--skip-mask-table", action="store_true")
    ap.add_argument("--launch", type=parse_kwargs, default={}, metavar="KEY=VALUE,...",
                    help="more fused_grouped_topk keyword arguments for every fused launch (an experiment as if served)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    sweep = SWEEP if args.tune else ()
    if args.sweep:
        if not args.tune:
            ap.error("--sweep needs --tune")
        want = {tuple(x.split(":")) for x in args.sweep}
        sweep = tuple(e for e in SWEEP if (e[0], str(e[1]), str(e[2])) in want)
        if len(sweep) != len(want):
            ap.error(f"--sweep: not all of {sorted(want)} are SWEEP entries")
    if not torch.cuda.is_available():
        print("gpu_masking: no CUDA device; nothing to measure", file=sys.stderr)
        return 2
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    import triton

    vllm_fn, vllm_desc = None, None
    if args.vllm_src:
        import vllm_grouped_topk

        vllm_fn, vllm_desc = vllm_grouped_topk.load(args.vllm_src)
    bwd = copy_bandwidth(dev)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "k": K, "pad_fraction": PAD_FRACTION, "copy_bandwidth": bwd, "vllm": vllm_desc, "tuned": args.tune,
           "launch": args.launch, "mask": [], "route": []}
    print(f"copy bandwidth {bwd['GBps']:.0f} GB/s; {vllm_desc}; fused launches + {args.launch}", flush=True)
    if not args.skip_mask_table:
        for T in args.tokens:
            doc["mask"].append(bench_mask(T, dev, gen))
    for router in args.routers:
        for dname in args.dtypes:
            for T in args.tokens:
                t0 = time.perf_counter()
                vfn = vllm_fn if args.vllm_cases is None or f"{router}:{dname}" in args.vllm_cases else None
                doc["route"].append(bench_route(router, dname, T, dev, gen, bwd["GBps"] * 1e9, vfn, sweep,
                                                args.launch))
                r = doc["route"][-1]
                print(f"  {router} {dname} T={T}: fused {r['fused']['median_us']:.2f} µs "
                      f"(limit {r['limit_us']:.2f}) vllm {r.get('vllm', {}).get('median_us', float('nan')):.1f} "
                      f"[{time.perf_counter() - t0:.1f} s]", flush=True)
                if args.json:  # after every case, so a later failure loses no measurement
                    Path(args.json).write_text(json.dumps(doc, indent=1))

    print_tables(doc)
    if args.plot:
        plot(doc, args.plot)
    bad = [r["T"] for r in doc["mask"] if not r["bit_identical"]]
    bad += [(r["router"], r["dtype"], r["T"]) for r in doc["route"] if not output_ok(r["check"])]
    if bad:
        print(f"MISMATCH: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
