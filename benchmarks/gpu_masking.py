"""GPU benchmark: padding mask and fused grouped top-k under CUDA-graph replay (H200).

Per MoE layer call, in µs, median of repeats; each op is captured many times into one
CUDA graph so the replay amortises launch cost the way a captured decode step does.

  mask:   (i) upstream's pair of out-of-place ``masked_fill`` (vLLM >= 0.31 router),
          (ii) the same pair in place (``masked_fill_``), (iii) our one-launch Triton kernel.
  route:  torch composite grouped top-k (``kernels.reference``, eager ops, + upstream's mask)
          vs the fused Triton kernel, each without and with the padding mask.

Inputs: k = 8, a quarter of the rows padded (at the end, as CUDA-graph padding is);
the mask buffer is longer than the batch (persistent, sliced like upstream does).
Routing: DeepSeek-V3 (256 experts / 8 groups / top-4 groups / top-8) and Kimi-style
(384 / 1 / 1 / 8), float32 logits.  Also checks the kernels against the torch
reference before timing each size (exits non-zero on a mismatch).

    python benchmarks/gpu_masking.py --json results/gpu_masking.json --plot results/gpu_masking.png
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_padplugin.kernels.reference import grouped_topk_reference  # noqa: E402
from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk  # noqa: E402
from vllm_padplugin.kernels.triton_mask import mask_padded_routes_inplace  # noqa: E402

TOKENS = (16, 64, 256, 1024, 4096, 16384, 32768)
K = 8
PAD_FRACTION = 0.25
ROUTERS = {
    "deepseek-v3": dict(num_experts=256, num_expert_group=8, topk_group=4, topk=8, scale=2.5),
    "kimi-style": dict(num_experts=384, num_expert_group=1, topk_group=1, topk=8, scale=2.827),
}


def graph_time_us(fn, *, target_ms: float = 20.0, repeats: int = 15, max_inner: int = 200) -> dict:
    """µs per call of ``fn`` under CUDA-graph replay: median (and spread) over ``repeats`` replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    # eager estimate to size the graph: enough calls per replay to run ~target_ms
    t0 = time.perf_counter()
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    est_ms = (time.perf_counter() - t0) / 5 * 1e3
    inner = int(max(5, min(max_inner, target_ms / max(est_ms, 1e-3))))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / inner)
    del g
    times.sort()
    return {
        "median_us": statistics.median(times),
        "min_us": times[0],
        "max_us": times[-1],
        "calls_per_graph": inner,
        "repeats": repeats,
    }


def routing_inputs(T: int, num_experts: int, gen: torch.Generator, dev: str):
    logits = torch.randn(T, num_experts, generator=gen, device=dev)
    bias = torch.randn(num_experts, generator=gen, device=dev) * 0.05
    mask = torch.zeros(T + 128, dtype=torch.bool, device=dev)
    mask[T - int(T * PAD_FRACTION) : T] = True
    mask[T:] = torch.rand(128, generator=gen, device=dev) < 0.5  # beyond the batch: must be ignored
    return logits, bias, mask


def bench_mask(T: int, dev: str, gen: torch.Generator) -> dict:
    logits, bias, mask = routing_inputs(T, 256, gen, dev)
    w0, i0 = grouped_topk_reference(logits, bias, topk=K, num_expert_group=8, topk_group=4)
    # correctness: Triton kernel == torch reference, bit for bit
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


def check_routing(fw, fi, rw, ri) -> dict:
    """ids equal as sets per row and weights equal per id (fp32 tolerance)."""
    fs, fo = fi.long().sort(1)
    rs, ro = ri.long().sort(1)
    rows_equal = (fs == rs).all(1)
    wdiff = (fw.gather(1, fo) - rw.gather(1, ro)).abs()[rows_equal]
    return {
        "rows": int(fi.shape[0]),
        "rows_id_sets_differ": int((~rows_equal).sum()),
        "max_weight_abs_diff": float(wdiff.max()) if wdiff.numel() else 0.0,
    }


def bench_route(router: str, T: int, dev: str, gen: torch.Generator, sweep: bool) -> dict:
    cfg = ROUTERS[router]
    logits, bias, mask = routing_inputs(T, cfg["num_experts"], gen, dev)
    kw = dict(topk=cfg["topk"], num_expert_group=cfg["num_expert_group"], topk_group=cfg["topk_group"],
              renormalize=True, routed_scaling_factor=cfg["scale"])
    rw, ri = grouped_topk_reference(logits, bias, is_padding=mask[:T], **kw)
    fw, fi = fused_grouped_topk(logits, bias, is_padding=mask, **kw)
    res = {"router": router, "T": T, "check": check_routing(fw, fi, rw, ri)}
    res["check"]["padded_rows_exact"] = bool(
        (fi[mask[:T]] == -1).all() and (fw[mask[:T]] == 0).all()
    )
    res["composite"] = graph_time_us(lambda: grouped_topk_reference(logits, bias, **kw))
    res["composite_masked"] = graph_time_us(lambda: grouped_topk_reference(logits, bias, is_padding=mask, **kw))
    out = (torch.empty(T, cfg["topk"], device=dev), torch.empty(T, cfg["topk"], dtype=torch.int32, device=dev))
    res["fused"] = graph_time_us(lambda: fused_grouped_topk(logits, bias, out=out, **kw))
    res["fused_masked"] = graph_time_us(lambda: fused_grouped_topk(logits, bias, is_padding=mask, out=out, **kw))
    no_pad = torch.zeros_like(mask)  # the mask present but nothing padded: the mask's pure overhead
    res["fused_masked_nopad"] = graph_time_us(lambda: fused_grouped_topk(logits, bias, is_padding=no_pad, out=out, **kw))
    res["mask_overhead_pct"] = 100 * (res["fused_masked"]["median_us"] / res["fused"]["median_us"] - 1)
    res["mask_overhead_nopad_pct"] = 100 * (res["fused_masked_nopad"]["median_us"] / res["fused"]["median_us"] - 1)
    res["speedup_vs_composite"] = res["composite_masked"]["median_us"] / res["fused_masked"]["median_us"]
    if sweep:
        res["sweep"] = []
        for bm, nw, skip in ((1, 1, False), (1, 1, True), (1, 2, False), (1, 2, True), (2, 1, True)):
                try:
                    fw, fi = fused_grouped_topk(logits, bias, is_padding=mask, block_m=bm, num_warps=nw,
                                                skip_padded_loads=skip, **kw)
                    chk = check_routing(fw, fi, rw, ri)
                    t = graph_time_us(
                        lambda: fused_grouped_topk(logits, bias, is_padding=mask, out=out, block_m=bm,
                                                   num_warps=nw, skip_padded_loads=skip, **kw), repeats=9)
                    t0 = graph_time_us(
                        lambda: fused_grouped_topk(logits, bias, is_padding=no_pad, out=out, block_m=bm,
                                                   num_warps=nw, skip_padded_loads=skip, **kw), repeats=9)
                    res["sweep"].append({"block_m": bm, "num_warps": nw, "skip_padded_loads": skip,
                                         "us": t["median_us"], "us_no_padded_rows": t0["median_us"], "check": chk})
                except Exception as exc:  # a config Triton cannot build: record, keep going
                    res["sweep"].append({"block_m": bm, "num_warps": nw, "error": repr(exc)[:200]})
    return res


def plot(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    Ts = [r["T"] for r in doc["mask"]]
    for key, label in (("upstream_pair", "upstream masked_fill pair"), ("inplace_pair", "in-place torch pair"),
                       ("triton", "Triton one-launch (ours)")):
        ax[0].plot(Ts, [r[key]["median_us"] for r in doc["mask"]], marker="o", label=label)
    ax[0].set(xscale="log", xlabel="tokens T (k=8)", ylabel="µs per MoE layer (graph replay)",
              title="Padding mask", ylim=(0, None))
    ax[0].legend()
    for router in ROUTERS:
        rows = [r for r in doc["route"] if r["router"] == router]
        Ts = [r["T"] for r in rows]
        ax[1].plot(Ts, [r["composite_masked"]["median_us"] for r in rows], marker="o", label=f"{router} torch composite + mask")
        ax[1].plot(Ts, [r["fused_masked"]["median_us"] for r in rows], marker="s", label=f"{router} fused Triton + mask")
    ax[1].set(xscale="log", yscale="log", xlabel="tokens T", ylabel="µs per MoE layer (graph replay)",
              title="Grouped top-k routing")
    ax[1].legend(fontsize=8)
    fig.suptitle(doc["device"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_tables(doc: dict) -> None:
    print(f"\n{doc['device']}  torch {doc['torch']}  triton {doc['triton']}  (µs per MoE layer call, CUDA-graph replay, median)")
    print(f"{'T':>6} {'upstream pair':>14} {'in-place pair':>14} {'Triton':>8} {'Triton/upstream':>16} {'bit-identical':>14}")
    for r in doc["mask"]:
        print(f"{r['T']:>6} {r['upstream_pair']['median_us']:>14.2f} {r['inplace_pair']['median_us']:>14.2f} "
              f"{r['triton']['median_us']:>8.2f} {r['triton_over_upstream']:>16.2f} {str(r['bit_identical']):>14}")
    print("\nfused+mask: 25 % rows padded; fused+mask0: mask given, no row padded")
    print(f"{'router':>12} {'T':>6} {'composite':>10} {'comp+mask':>10} {'fused':>8} {'fused+mask':>10} {'fused+mask0':>11} "
          f"{'ovh %':>6} {'ovh0 %':>6} {'speed-up':>9} {'id sets differ':>14} {'max |dw|':>9}")
    for r in doc["route"]:
        print(f"{r['router']:>12} {r['T']:>6} {r['composite']['median_us']:>10.1f} {r['composite_masked']['median_us']:>10.1f} "
              f"{r['fused']['median_us']:>8.2f} {r['fused_masked']['median_us']:>10.2f} {r['fused_masked_nopad']['median_us']:>11.2f} "
              f"{r['mask_overhead_pct']:>6.2f} {r['mask_overhead_nopad_pct']:>6.2f} "
              f"{r['speedup_vs_composite']:>9.1f} {r['check']['rows_id_sets_differ']:>14} {r['check']['max_weight_abs_diff']:>9.1e}")
    for r in doc["route"]:
        if "sweep" in r:
            best = min((s for s in r["sweep"] if "us" in s), key=lambda s: s["us"])
            print(f"sweep {r['router']} T={r['T']}: best block_m={best['block_m']} num_warps={best['num_warps']} "
                  f"skip_padded_loads={best.get('skip_padded_loads')} {best['us']:.2f} µs "
                  f"(default {r['fused_masked']['median_us']:.2f} µs; unmasked {r['fused']['median_us']:.2f} µs)")
            for sw in r["sweep"]:
                if "us" in sw:
                    print(f"    bm={sw['block_m']} nw={sw['num_warps']} skip={sw.get('skip_padded_loads')}: "
                          f"{sw['us']:.2f} µs (25 % padded), {sw.get('us_no_padded_rows', float('nan')):.2f} µs (none padded)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    ap.add_argument("--sweep-tokens", type=int, nargs="*", default=[16, 1024, 4096, 32768],
                    help="sizes at which to sweep the fused kernel's BLOCK_M x num_warps")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_masking: no CUDA device; nothing to measure", file=sys.stderr)
        return 2
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    import triton

    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "k": K, "pad_fraction": PAD_FRACTION, "mask": [], "route": []}
    for T in args.tokens:
        doc["mask"].append(bench_mask(T, dev, gen))
    for router in ROUTERS:
        for T in args.tokens:
            doc["route"].append(bench_route(router, T, dev, gen, sweep=T in args.sweep_tokens))

    if args.json:  # first, so a later printing/plotting error loses no measurement
        Path(args.json).write_text(json.dumps(doc, indent=1))
    print_tables(doc)
    if args.plot:
        plot(doc, args.plot)
    bad = [r["T"] for r in doc["mask"] if not r["bit_identical"]]
    bad += [(r["router"], r["T"]) for r in doc["route"] if not r["check"]["padded_rows_exact"]]
    if bad:
        print(f"MISMATCH: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
