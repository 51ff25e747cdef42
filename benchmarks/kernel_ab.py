"""The served fused grouped top-k against its candidate variants, timed interleaved (issue 11, goal 1).

A variant of the "regs" kernel replaces the served build only after it wins here, on the device
the goal is stated for.  Each variant is checked against the torch reference, captured into its
own CUDA graph, and the graphs are replayed in rounds in a rotated order
(``gpu_masking.interleaved``); a variant's % is the median of its per-round ratios to the served
build, with the 10th-90th percentile.  ``again`` is the served build in a second graph: the A/A
control.  Every variant gets the padding mask with no row padded by default (``--padding``), as
vLLM serving passes it.  limit = bytes the kernel must move / the device-to-device copy bandwidth
measured at the start of the same run.

Variants (``fused_grouped_topk`` keyword arguments; "served" leaves ``short_chain`` to
``short_chain_served``, which picked it where it won here):
  long_chain   short_chain=False: the groups ranked by ``topk_group`` rounds of two dependent
               butterfly reductions; each lane counts its list's values above and at thr, two
               scans and a tie test (the build served before 2026-12-06)
  short_chain  short_chain=True: the groups ranked by one independent shuffle per other group; a
               lane takes its values >= thr wherever a row has exactly ``topk`` of them, found by
               a population count; ties counted only in a block where some row has more. Same
               results, 12-18 % fewer instructions on the common path (SASS)

``--candidate NAME:KEY=VALUE,...`` replaces those two with other keyword arguments, e.g. a
variant that exists only in a patched tree (``benchmarks/results/pad_exit_word.patch``, on a
checkout of 27ecdaf) timed against that tree's served build: ``--candidate pe:pad_exit=True``.
A candidate may take its own mask: ``--padding off --candidate m:padding=none`` times the mask's cost.

    python benchmarks/kernel_ab.py --json kernel_ab.json --plot kernel_ab.png
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_masking import (copy_bandwidth, interleaved_args, interleaved_cases, interleaved_doc,  # noqa: E402
                         mismatch_status, parse_kwargs, pct_cell, plot_pct)

TOKENS = (16, 256, 1024, 4096, 16384, 32768)
CANDIDATES = {"long_chain": {"short_chain": False}, "short_chain": {"short_chain": True}}
PADDINGS = {"none": "none", "pad25": "pad25", "off": None}  # --padding's choices -> gpu_masking.interleaved's


def parse_candidate(text: str) -> tuple[str, dict]:
    """``"top4:short_chain=True,top4=True"`` -> ``("top4", {"short_chain": True, "top4": True})``;
    ``padding=none|pad25|off`` gives the candidate its own mask instead of ``--padding``'s."""
    name, sep, kws = text.partition(":")
    if not name.isidentifier() or name in ("served", "again") or not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: want NAME:KEY=VALUE,... (NAME not served/again)")
    items = [x for x in kws.split(",") if x.strip()]
    pads = [x.partition("=")[2].strip() for x in items if x.partition("=")[0].strip() == "padding"]
    if any(p not in PADDINGS for p in pads):
        raise argparse.ArgumentTypeError(f"{text!r}: padding is one of {', '.join(PADDINGS)}")
    kw = parse_kwargs(",".join(x for x in items if x.partition("=")[0].strip() != "padding"))
    return name, ({"padding": PADDINGS[pads[-1]]} if pads else {}) | kw


def variants(padding: str | None, candidates: dict[str, dict] | None = None) -> dict[str, dict]:
    """``interleaved``'s variants: served, again, then the candidates (default ``CANDIDATES``),
    all with ``padding``."""
    calls = {"served": {}, "again": {}, **(CANDIDATES if candidates is None else candidates)}
    return {name: {"padding": padding, **kw} for name, kw in calls.items()}


def print_table(doc: dict) -> None:
    names = [n for n in doc["variants"] if n != "served"]
    print(f"\n{doc['device']}  torch {doc['torch']}  triton {doc['triton']}  "
          f"copy {doc['copy_bandwidth']['GBps']:.0f} GB/s  padding={doc['padding']}  ({doc['rounds']} interleaved "
          "rounds of CUDA-graph replay; % = median per-round ratio to 'served' - 1, [10th, 90th percentile])")
    head = f"{'router':>11} {'dt':>4} {'T':>6} {'kernel':>10} {'served µs':>9} {'limit µs':>8} {'/limit':>6}"
    head += "".join(f" {n + ' %':>21}" for n in names) + f" {'best':>11} {'best µs':>8} {'/limit':>6}"
    print(head)
    for r in doc["cases"]:
        c = r["config"]
        best = min((n for n in r["us"] if n != "again"), key=r["us"].get)  # the served build or a candidate
        line = (f"{r['router']:>11} {r['dtype']:>4} {r['T']:>6} {c['kernel']:>4},{c['block_m']},{c['num_warps']:<3} "
                f"{r['us']['served']:>9.2f} {r['limit_us']:>8.2f} {r['us']['served'] / r['limit_us']:>6.2f}")
        line += "".join(pct_cell(r[f"{n}_pct"]) for n in names)
        line += f" {best:>11} {r['us'][best]:>8.2f} {r['us'][best] / r['limit_us']:>6.2f}"
        print(line)


def plot(doc: dict, path: str) -> None:
    names = [n for n in doc["variants"] if n != "served"]
    plot_pct(doc, path, [(n, "gray" if n == "again" else f"C{i}") for i, n in enumerate(names)],
             ylabel="time vs served build, %", title="regs variants")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--padding", choices=tuple(PADDINGS), default="none",
                    help="the mask every variant gets: no row padded (serving, default), a quarter padded, or no mask")
    ap.add_argument("--candidate", type=parse_candidate, action="append", metavar="NAME:KEY=VALUE,...",
                    help="time this variant instead of the default candidates (repeatable)")
    args = interleaved_args(ap, TOKENS, 21)
    padding = PADDINGS[args.padding]
    calls = variants(padding, dict(args.candidate) if args.candidate else None)
    run = interleaved_doc("kernel_ab", args, padding=args.padding, variants=list(calls))
    if run is None:
        return 2
    gen, doc = run
    bwd = doc["copy_bandwidth"] = copy_bandwidth("cuda")

    def limit(r: dict) -> None:
        r["limit_us"] = (r["bytes"] + (r["T"] if padding else 0)) / (bwd["GBps"] * 1e9) * 1e6

    interleaved_cases(args, doc, calls, "served", "cuda", gen, per_case=limit)
    print_table(doc)
    if args.plot:
        plot(doc, args.plot)
    return mismatch_status(doc)


if __name__ == "__main__":
    raise SystemExit(main())
