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
  pad25        25 % of rows padded (padded rows skip their logits where ``skip_padded_loads_served``)
  pad25_loads  25 % padded, padded rows still load their logits (``skip_padded_loads=False``)
  *_late       nopad / nopad_loads with ``early_flag=False``: the flag's load where ptxas puts it,
               after the routing, instead of with the logits' (served for routers that drop
               groups: ``early_flag_served``; it acts where padded rows load their logits)

Each variant's output is checked first (the torch reference's expert set per row, padded rows
exactly (-1, 0)); the script exits 1 on a mismatch.

    python benchmarks/mask_cost.py --json mask_cost.json --plot mask_cost.png
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_masking import (interleaved_args, interleaved_cases, interleaved_doc, mismatch_status,  # noqa: E402
                         pct_cell, plot_pct)

TOKENS = (16, 64, 256, 1024, 4096, 32768)
# fused_grouped_topk's keyword arguments per variant (gpu_masking.interleaved's "padding")
CALLS = {"none": {}, "again": {}, "nopad": {"padding": "none"},
         "nopad_loads": {"padding": "none", "skip_padded_loads": False}, "pad25": {"padding": "pad25"},
         "pad25_loads": {"padding": "pad25", "skip_padded_loads": False}}
CALLS.update({f"{n}_late": dict(CALLS[n], early_flag=False) for n in ("nopad", "nopad_loads")})
VARIANTS = tuple(CALLS)


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
        line += "".join(pct_cell(r[f"{name}_pct"]) for name in VARIANTS[1:])
        print(line)


def plot(doc: dict, path: str) -> None:
    plot_pct(doc, path, (("again", "gray"), ("nopad", "C0"), ("nopad_loads", "C2"), ("pad25", "C1"),
                         ("nopad_late", "C3")),
             ylabel="time vs unmasked kernel, %", title="mask cost", band=(-1, 1, "±1 % (goal)"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = interleaved_args(ap, TOKENS, 41)
    run = interleaved_doc("mask_cost", args)
    if run is None:
        return 2
    gen, doc = run
    interleaved_cases(args, doc, CALLS, "none", "cuda", gen)
    print_table(doc)
    if args.plot:
        plot(doc, args.plot)
    return mismatch_status(doc)


if __name__ == "__main__":
    raise SystemExit(main())
