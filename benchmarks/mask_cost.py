"""The padding mask's cost inside the fused grouped top-k, timed interleaved (issue 11, goal 2).

``gpu_masking.py`` times each variant in its own block of replays, one block after another,
so drift between blocks (clocks, temperature) lands in its mask columns: there the same launch
timed twice differs by up to ~5 % (its ``rep%``), more than the 1 % the goal asks to resolve.
Here each variant is captured once into its own CUDA graph and the graphs are replayed in
rounds, one replay of each per round in a rotated order.  A variant's cost is the median over
rounds of its per-round ratio to the unmasked kernel, printed with the 10th-90th percentile of
those ratios.  ``again`` is a second graph of the unmasked kernel: the A/A control, i.e. the
resolution of the other columns.

Variants, all with the ``default_config`` kernel the plugin launches:
  none         no mask (``is_padding=None``)
  again        no mask, its own graph (A/A)
  nopad        mask given, no row padded: what the mask costs where it changes nothing
  nopad_loads  the same, logits loaded without waiting for the flag (``skip_padded_loads=False``)
  pad25        25 % of rows padded (padded rows skip their logits above 1024 tokens)
  pad25_loads  25 % padded, padded rows still load their logits (``skip_padded_loads=False``)

Each variant's output is checked first (the torch reference's expert set per row, padded rows
exactly (-1, 0)); the script exits 1 on a mismatch.

    python benchmarks/mask_cost.py --json mask_cost.json --plot mask_cost.png
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_masking import (DTYPES, ROUTERS, capture_graph, check_output, input_sets, output_ok,  # noqa: E402
                         replay_us, route_kwargs, routing_inputs)

from vllm_padplugin.kernels.reference import grouped_topk_reference  # noqa: E402
from vllm_padplugin.kernels.triton_grouped_topk import default_config, fused_grouped_topk  # noqa: E402

TOKENS = (16, 64, 256, 1024, 4096, 32768)
VARIANTS = ("none", "again", "nopad", "nopad_loads", "pad25", "pad25_loads")


def measure(router: str, dname: str, T: int, dev: str, gen: torch.Generator, rounds: int,
            target_ms: float) -> dict:
    cfg = ROUTERS[router]
    E, k = cfg["num_experts"], cfg["topk"]
    logits, bias, mask = routing_inputs(T, E, DTYPES[dname], gen, dev)
    sets = input_sets(logits, gen)
    nsets = len(sets)
    kw = route_kwargs(cfg)
    no_pad = torch.zeros_like(mask)
    extra = {"none": {}, "again": {}, "nopad": {"is_padding": no_pad},
             "nopad_loads": {"is_padding": no_pad, "skip_padded_loads": False}, "pad25": {"is_padding": mask},
             "pad25_loads": {"is_padding": mask, "skip_padded_loads": False}}
    out = (torch.empty(T, k, device=dev), torch.empty(T, k, dtype=torch.int32, device=dev))
    choice = logits.float().sigmoid() + bias
    checks = {}
    for name, ex in extra.items():
        pad = ex.get("is_padding", no_pad)[:T]
        rw, ri = grouped_topk_reference(logits, bias, is_padding=pad, **kw)
        checks[name] = check_output(lambda ex=ex: fused_grouped_topk(logits, bias, out=out, **kw, **ex),
                                    out, rw, ri, choice, cfg, pad)
    graphs = {name: capture_graph([lambda x=x, ex=ex: fused_grouped_topk(x, bias, out=out, **kw, **ex) for x in sets],
                                  target_ms=target_ms)
              for name, ex in extra.items()}
    us = {name: [] for name in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for name in order:
            us[name].append(replay_us(*graphs[name]))
    del graphs, sets
    kern, bm, nw = default_config(T, E, DTYPES[dname], num_expert_group=cfg["num_expert_group"],
                                  topk_group=cfg["topk_group"], topk=k)
    res = {"router": router, "dtype": dname, "T": T, "config": {"kernel": kern, "block_m": bm, "num_warps": nw},
           "rounds": rounds, "input_sets": nsets, "checks": checks,
           "us": {n: statistics.median(v) for n, v in us.items()}, "us_rounds": us}
    for name in VARIANTS[1:]:
        ratios = [100 * (a / b - 1) for a, b in zip(us[name], us["none"])]
        dec = statistics.quantiles(ratios, n=10, method="inclusive")
        res[f"{name}_pct"] = {"median": statistics.median(ratios), "p10": dec[0], "p90": dec[-1]}
    return res


def print_table(doc: dict) -> None:
    print(f"\n{doc['device']}  torch {doc['torch']}  triton {doc['triton']}  (graph replay, {doc['rounds']} "
          "interleaved rounds; % = median per-round ratio to 'none' - 1, [10th, 90th percentile])")
    head = f"{'router':>11} {'dt':>4} {'T':>6} {'kernel':>10} {'none µs':>8}"
    for name in VARIANTS[1:]:
        head += f" {name + ' %':>21}"
    print(head)
    for r in doc["cases"]:
        c = r["config"]
        line = (f"{r['router']:>11} {r['dtype']:>4} {r['T']:>6} {c['kernel']:>4},{c['block_m']},{c['num_warps']:<3} "
                f"{r['us']['none']:>8.2f}")
        for name in VARIANTS[1:]:
            p = r[f"{name}_pct"]
            line += f" {p['median']:>+6.2f} [{p['p10']:>+5.1f},{p['p90']:>+5.1f}]"
        print(line)


def plot(doc: dict, path: str) -> None:
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
            for name, color in (("again", "gray"), ("nopad", "C0"), ("nopad_loads", "C2"), ("pad25", "C1")):
                med = [r[f"{name}_pct"]["median"] for r in rows]
                lo = [m - r[f"{name}_pct"]["p10"] for m, r in zip(med, rows)]
                hi = [r[f"{name}_pct"]["p90"] - m for m, r in zip(med, rows)]
                a.errorbar(Ts, med, yerr=[lo, hi], ls=ls, color=color, marker="o", capsize=3,
                           label=f"{name} {dname}")
        a.axhspan(-1, 1, color="green", alpha=0.1, label="±1 % (goal)")
        a.set(xscale="log", xlabel="tokens T", ylabel="time vs unmasked kernel, %", title=f"mask cost, {router}")
        a.legend(fontsize=7)
    fig.suptitle(f"{doc['device']}: median of {doc['rounds']} interleaved rounds, bars 10th-90th percentile")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    ap.add_argument("--dtypes", nargs="*", default=list(DTYPES))
    ap.add_argument("--routers", nargs="*", default=list(ROUTERS))
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--target-ms", type=float, default=2.0, help="about how long one replay of a graph takes")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    if args.rounds < 5:
        ap.error("--rounds: at least 5 (percentiles of fewer ratios mean little)")
    if not torch.cuda.is_available():
        print("mask_cost: no CUDA device; nothing to measure", file=sys.stderr)
        return 2
    import triton

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rounds": args.rounds, "target_ms": args.target_ms, "cases": []}
    for router in args.routers:
        for dname in args.dtypes:
            for T in args.tokens:
                t0 = time.perf_counter()
                r = measure(router, dname, T, dev, gen, args.rounds, args.target_ms)
                doc["cases"].append(r)
                print(f"  {router} {dname} T={T}: none {r['us']['none']:.2f} µs, nopad {r['nopad_pct']['median']:+.2f} %,"
                      f" again {r['again_pct']['median']:+.2f} % [{time.perf_counter() - t0:.1f} s]", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(doc, indent=1))
    print_table(doc)
    if args.plot:
        plot(doc, args.plot)
    bad = [(r["router"], r["dtype"], r["T"], n) for r in doc["cases"] for n, c in r["checks"].items()
           if not output_ok(c)]
    if bad:
        print(f"MISMATCH: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
