"""Expert-parallel MoE step on ONE GPU: the EP ranks emulated one after another.

Turns the balance benchmark's simulated straggler factor into measured GPU time.  For
every padding scenario of ``vllm_padplugin.bench.balance`` (DeepSeek-V3 and Kimi-style
routers, EP 8/16/32, SP / CUDA-graph / DP-dummy padding, zero or stale padded hidden
states) the routing that ``balance.run_scenario`` computes is recorded (without the
plugin, with the plugin's mask, real tokens only), turned into per-expert token counts
with DeepEP's dispatch rule, and each EP rank's expert work is run on the GPU:
for each local expert with n tokens, ``[n, 7168] x [7168, 2*2048]`` -> SiLU-and-mul ->
``[n, 2048] x [2048, 7168]`` in bf16 (DeepSeek-V3 expert sizes, 256 experts split over
the ranks; Kimi-style: 384 experts, same sizes), captured in a CUDA graph and timed by
replay.  Step time = max busy time over ranks (what the slowest rank makes everyone
wait for); also mean, max/mean, and the speed-up of masking.

NOT measured: the all-to-all itself (one GPU; see ``ep_step_nccl.py`` for the NCCL path),
shared experts, attention.  Experts are looped per expert with cuBLAS (each rank's graph
removes launch gaps); a grouped GEMM kernel (DeepGEMM) would be faster per token but
scales the same way with rows.

Two steps, so the GPU run needs no routing code:
    python benchmarks/ep_step_emulation.py --counts-out benchmarks/results/ep_counts.json   # CPU
    python benchmarks/ep_step_emulation.py --counts benchmarks/results/ep_counts.json \
        --json results/ep_step.json --plot results/ep_step.png                                # GPU
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HIDDEN = 7168
INTER = 2048
VARIANTS = ("without_plugin", "with_plugin", "real_only")


# ---------------------------------------------------------------- routing (CPU)
def record_scenario(spec, ep_size: int, kind: str, hidden: str, cfg) -> dict:
    """Run ``balance.run_scenario`` and record the routing it computes (its own functions, unmodified)."""
    from vllm_padplugin.bench import balance
    from vllm_padplugin.bench.routers import tokens_per_rank

    seen: dict[str, list] = {"route": [], "mask": []}
    orig_route, orig_mask = balance.grouped_topk, balance.mask_padded_routes

    def route(*a, **kw):
        out = orig_route(*a, **kw)
        seen["route"].append(out[1])
        return out

    def mask(*a, **kw):
        out = orig_mask(*a, **kw)
        seen["mask"].append(out[1])
        return out

    balance.grouped_topk, balance.mask_padded_routes = route, mask
    try:
        scen = balance.run_scenario(spec, ep_size, kind, hidden, cfg)
    finally:
        balance.grouped_topk, balance.mask_padded_routes = orig_route, orig_mask
    if len(seen["route"]) != 2 or len(seen["mask"]) != 1:
        raise RuntimeError("balance.run_scenario changed shape: expected 2 routings and 1 mask")
    ids = {"without_plugin": seen["route"][0], "with_plugin": seen["mask"][0], "real_only": seen["route"][1]}
    e = spec.num_experts
    out = {k: scen[k] for k in ("name", "router", "ep_size", "kind", "hidden", "real_rows", "padded_rows")}
    for v, t in ids.items():
        tpr = tokens_per_rank(t, e, ep_size).tolist()
        if tpr != scen[f"tokens_per_rank_{v}"]:  # proves we recorded the same routing the benchmark reports
            raise RuntimeError(f"{scen['name']}: recorded routing disagrees with balance ({v})")
        out[f"tokens_per_rank_{v}"] = tpr
        flat = t.reshape(-1).long()
        out[f"pairs_per_expert_{v}"] = torch.bincount(flat[flat >= 0], minlength=e).tolist()
    out["num_experts"] = e
    return out


def compute_counts() -> dict:
    from vllm_padplugin.bench import balance
    from vllm_padplugin.bench.routers import ROUTERS

    cfg = balance.Config()
    scenarios = [
        record_scenario(spec, ep, kind, hidden, cfg)
        for spec in ROUTERS.values()
        for ep in cfg.ep_sizes
        for kind in balance.KINDS
        for hidden in balance.HIDDEN_VARIANTS
    ]
    return {"source": "vllm_padplugin.bench.balance.run_scenario (Config())", "scenarios": scenarios}


# ---------------------------------------------------------------- expert GEMMs (GPU)
class Experts:
    """All experts' bf16 weights on the GPU (random, scaled), plus scratch buffers."""

    def __init__(self, num_experts: int, max_rows: int, dev: str):
        g = torch.Generator(device=dev).manual_seed(0)
        self.w13 = torch.empty(num_experts, 2 * INTER, HIDDEN, dtype=torch.bfloat16, device=dev)
        self.w2 = torch.empty(num_experts, HIDDEN, INTER, dtype=torch.bfloat16, device=dev)
        for e in range(num_experts):  # per expert: keeps the fp32 temporary small
            self.w13[e].copy_(torch.randn(2 * INTER, HIDDEN, generator=g, device=dev) * HIDDEN**-0.5)
            self.w2[e].copy_(torch.randn(HIDDEN, INTER, generator=g, device=dev) * INTER**-0.5)
        self.x = torch.randn(max_rows, HIDDEN, generator=g, device=dev).to(torch.bfloat16)
        self.h = torch.empty(max_rows, 2 * INTER, dtype=torch.bfloat16, device=dev)
        self.a = torch.empty(max_rows, INTER, dtype=torch.bfloat16, device=dev)
        self.y = torch.empty(max_rows, HIDDEN, dtype=torch.bfloat16, device=dev)

    def rank_step(self, first_expert: int, counts: list[int]) -> None:
        """One rank's expert work; rows of each expert contiguous (DeepEP/DeepGEMM contiguous layout)."""
        row = 0
        for j, n in enumerate(counts):
            if n == 0:
                continue
            e = first_expert + j
            sl = slice(row, row + n)
            torch.mm(self.x[sl], self.w13[e].t(), out=self.h[sl])
            gate, up = self.h[sl, :INTER], self.h[sl, INTER:]
            torch.mul(torch.nn.functional.silu(gate), up, out=self.a[sl])
            torch.mm(self.a[sl], self.w2[e].t(), out=self.y[sl])
            row += n


def time_rank(experts: Experts, first: int, counts: list[int], repeats: int) -> float:
    """Median µs of one rank's expert work under CUDA-graph replay (0 when it has no rows)."""
    if sum(counts) == 0:
        return 0.0
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        experts.rank_step(first, counts)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        experts.rank_step(first, counts)
    g.replay()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    del g
    return statistics.median(times)


def run_gpu(counts_doc: dict, repeats: int, only: str | None, dev: str = "cuda") -> dict:
    scenarios = [s for s in counts_doc["scenarios"] if not only or only in s["name"]]
    results = []
    by_e: dict[int, list] = {}
    for s in scenarios:
        by_e.setdefault(s["num_experts"], []).append(s)
    for num_experts, group in by_e.items():
        max_rows = max(
            sum(s[f"pairs_per_expert_{v}"][r * (num_experts // s["ep_size"]):(r + 1) * (num_experts // s["ep_size"])])
            for s in group for v in VARIANTS for r in range(s["ep_size"])
        )
        experts = Experts(num_experts, max(max_rows, 1), dev)
        cache: dict[tuple, float] = {}
        for s in group:
            per = num_experts // s["ep_size"]
            item = {k: s[k] for k in ("name", "router", "ep_size", "kind", "hidden", "real_rows", "padded_rows")}
            for v in VARIANTS:
                busy = []
                for r in range(s["ep_size"]):
                    c = s[f"pairs_per_expert_{v}"][r * per:(r + 1) * per]
                    key = (r * per, tuple(c))
                    if key not in cache:
                        cache[key] = time_rank(experts, r * per, c, repeats)
                    busy.append(cache[key])
                mean = statistics.fmean(busy)
                item[f"busy_us_{v}"] = [round(b, 2) for b in busy]
                item[f"step_us_{v}"] = max(busy)
                item[f"mean_busy_us_{v}"] = mean
                item[f"max_over_mean_{v}"] = max(busy) / mean if mean else 1.0
                item[f"gemm_rows_max_rank_{v}"] = max(
                    sum(s[f"pairs_per_expert_{v}"][r * per:(r + 1) * per]) for r in range(s["ep_size"])
                )
            item["speedup_with_plugin"] = item["step_us_without_plugin"] / item["step_us_with_plugin"]
            item["with_plugin_over_real_only"] = item["step_us_with_plugin"] / item["step_us_real_only"]
            results.append(item)
            print(f"{item['name']:<42} step µs without {item['step_us_without_plugin']:>9.1f} "
                  f"with {item['step_us_with_plugin']:>9.1f} real {item['step_us_real_only']:>9.1f} "
                  f"speed-up {item['speedup_with_plugin']:.3f}", flush=True)
        del experts
        torch.cuda.empty_cache()
    return {"device": torch.cuda.get_device_name() if dev == "cuda" else dev, "torch": torch.__version__, "hidden": HIDDEN,
            "expert_intermediate": INTER, "dtype": "bfloat16", "repeats": repeats, "scenarios": results}


def table(doc: dict) -> str:
    lines = [f"{doc['device']}: expert GEMM busy time per MoE layer step, EP ranks emulated one after another "
             f"(bf16, hidden {doc['hidden']}, expert intermediate {doc['expert_intermediate']}; µs)",
             f"{'scenario':<42} {'step w/o':>9} {'step with':>9} {'real only':>9} {'speed-up':>8} "
             f"{'max/mean w/o':>12} {'max/mean with':>13} {'max/mean real':>13}"]
    for s in doc["scenarios"]:
        lines.append(f"{s['name']:<42} {s['step_us_without_plugin']:>9.1f} {s['step_us_with_plugin']:>9.1f} "
                     f"{s['step_us_real_only']:>9.1f} {s['speedup_with_plugin']:>8.3f} "
                     f"{s['max_over_mean_without_plugin']:>12.3f} {s['max_over_mean_with_plugin']:>13.3f} "
                     f"{s['max_over_mean_real_only']:>13.3f}")
    return "\n".join(lines)


def plot(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routers = sorted({s["router"] for s in doc["scenarios"]})
    fig, axes = plt.subplots(len(routers), 1, figsize=(16, 4.5 * len(routers)), squeeze=False)
    for ax, router in zip(axes[:, 0], routers):
        rows = [s for s in doc["scenarios"] if s["router"] == router]
        x = range(len(rows))
        for off, (v, label) in zip((-0.27, 0, 0.27), (("without_plugin", "without plugin"),
                                                       ("with_plugin", "with plugin (masked)"),
                                                       ("real_only", "real tokens only"))):
            ax.bar([i + off for i in x], [s[f"step_us_{v}"] / 1e3 for s in rows], width=0.27, label=label)
        ax.set_xticks(list(x), [s["name"].split("/", 1)[1] for s in rows], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("step time (ms) = max rank busy")
        ax.set_yscale("log")
        ax.set_title(f"{router}: expert GEMMs per EP step, ranks emulated on one {doc['device']}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts-out", help="CPU step: write the per-expert token counts of every scenario here")
    ap.add_argument("--counts", help="GPU step: read counts from here (else computed now)")
    ap.add_argument("--only", help="substring filter on scenario names")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args()
    if args.counts_out:
        doc = compute_counts()
        Path(args.counts_out).write_text(json.dumps(doc, separators=(",", ":")))
        print(f"wrote {len(doc['scenarios'])} scenarios to {args.counts_out}")
        return 0
    if not torch.cuda.is_available():
        print("ep_step_emulation: no CUDA device (use --counts-out for the CPU step)", file=sys.stderr)
        return 2
    counts = json.loads(Path(args.counts).read_text()) if args.counts else compute_counts()
    doc = run_gpu(counts, args.repeats, args.only)
    print(table(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.plot:
        plot(doc, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
