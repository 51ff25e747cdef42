"""Expert-parallel balance benchmark: what padding rows do to DeepEP dispatch, and what masking fixes.

Each scenario builds the batches that the data-parallel/EP ranks of one MoE layer step
hold (real tokens + the padding rows vLLM adds), routes them with a DeepSeek-V3 or
Kimi-style router (``routers.grouped_topk``), applies the plugin's REAL masking code
(``vllm_padplugin.masking.mask_padded_routes``) and counts, with DeepEP's dispatch
rule, the tokens every EP rank receives.  Pure torch, no vLLM import, fixed seeds.

Padding sources modelled (vLLM V1, DP attention + EP MoE, one EP rank per DP rank):
  sp-*             sequence parallelism pads each TP group's batch to a multiple of TP (vLLM's
                   ``sequence_parallel_chunk``: zero rows appended, then one chunk per TP rank, so
                   the padding lands on the last TP rank(s); the ``stale`` variant is for comparison);
  cudagraph-decode DP ranks synchronise their token count to the DP maximum, then pad it up
                   to the next CUDA-graph capture size (1, 2, 4, 8, 16, 24, ... 256, 272, ... 512);
  dp-dummy-decode  idle DP ranks must still join every all-to-all, so they run a dummy batch
                   of that synchronised size: all rows are padding.
Padding rows' hidden states are either zero (identical logits -> identical experts) or stale
(copies of rows of an earlier step, as persistent buffers hold).
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Any

import torch

from vllm_padplugin.bench.routers import (
    ROUTERS,
    RouterSpec,
    dispatch_targets,
    grouped_topk,
    straggler_factor,
    tokens_per_rank,
)
from vllm_padplugin.masking import mask_padded_routes

GATE_HIDDEN = 64  # routing depends on the logits' distribution, not on the model width
TP_SIZE = 8  # attention TP group size for the sequence-parallel scenarios
MAX_CAPTURE_SIZE = 512  # vLLM's default max_cudagraph_capture_size (non-Blackwell)
KINDS = ("sp-decode", "sp-prefill", "cudagraph-decode", "dp-dummy-decode")
HIDDEN_VARIANTS = ("zero", "stale")


def capture_sizes(max_size: int = MAX_CAPTURE_SIZE) -> list[int]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, multiples of 8 below 256, then of 16."""
    return [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))


def pad_to_capture_size(num_tokens: int, sizes: list[int]) -> int:
    """Smallest capture size >= num_tokens; above the largest, vLLM runs eagerly (no padding)."""
    for size in sizes:
        if size >= num_tokens:
            return size
    return num_tokens


@dataclass(frozen=True)
class Config:
    """Sizes of one run; ``quick`` keeps the test run to a few seconds."""

    ep_sizes: tuple[int, ...] = (8, 16, 32)
    decode_tokens: tuple[int, int] = (1, 256)  # per DP rank (or TP group), uniform
    prefill_tokens: tuple[int, int] = (1024, 8192)  # per TP group, uniform (max_num_batched_tokens 8192)
    idle_fraction: float = 0.25  # DP ranks with no request in dp-dummy-decode
    seed: int = 0

    @classmethod
    def quick(cls) -> "Config":
        return cls(ep_sizes=(8, 16), prefill_tokens=(256, 1024))


def _rand_int(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi + 1, (1,), generator=gen).item())


def batch_layout(kind: str, ep_size: int, cfg: Config, gen: torch.Generator) -> list[tuple[int, int]]:
    """(real rows, padding rows) held by each EP rank for one step of ``kind``."""
    if kind in ("sp-decode", "sp-prefill"):
        lo, hi = cfg.decode_tokens if kind == "sp-decode" else cfg.prefill_tokens
        tp = min(TP_SIZE, ep_size)
        ranks: list[tuple[int, int]] = []
        for _ in range(ep_size // tp):
            real = _rand_int(gen, lo, hi)
            padded = -(-real // tp) * tp
            chunk = padded // tp  # each TP rank dispatches its chunk; the padding sits at the end
            for r in range(tp):
                start, stop = r * chunk, (r + 1) * chunk
                n_real = max(0, min(stop, real) - start)
                ranks.append((n_real, chunk - n_real))
        return ranks
    if kind in ("cudagraph-decode", "dp-dummy-decode"):
        lo, hi = cfg.decode_tokens
        idle = set()
        if kind == "dp-dummy-decode":
            n_idle = max(1, int(ep_size * cfg.idle_fraction))
            idle = set(torch.randperm(ep_size, generator=gen)[:n_idle].tolist())
        real = [0 if r in idle else _rand_int(gen, lo, hi) for r in range(ep_size)]
        size = pad_to_capture_size(max(real), capture_sizes())
        return [(n, size - n) for n in real]
    raise ValueError(f"unknown scenario kind {kind!r}; expected one of {KINDS}")


def _seed(*parts: Any) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def run_scenario(spec: RouterSpec, ep_size: int, kind: str, hidden: str, cfg: Config) -> dict[str, Any]:
    """Route one step of ``kind`` on ``ep_size`` ranks, with and without the plugin's mask."""
    gen = torch.Generator().manual_seed(_seed(cfg.seed, spec.name, "gate"))
    gate = torch.randn(spec.num_experts, GATE_HIDDEN, generator=gen) / GATE_HIDDEN**0.5
    bias = torch.randn(spec.num_experts, generator=gen) * 0.01 if spec.correction_bias else None

    # The batch layout and real tokens depend on (router, ep, kind) only, so the zero and stale
    # variants of a scenario share the same real tokens.
    gen = torch.Generator().manual_seed(_seed(cfg.seed, spec.name, ep_size, kind))
    layout = batch_layout(kind, ep_size, cfg, gen)
    rows, is_padding = [], []
    for n_real, n_pad in layout:
        real = torch.randn(n_real, GATE_HIDDEN, generator=gen)
        earlier = torch.randn(n_real + n_pad, GATE_HIDDEN, generator=gen)  # this rank's previous step
        pad = torch.zeros(n_pad, GATE_HIDDEN) if hidden == "zero" else earlier[n_real:]
        rows += [real, pad]
        is_padding += [torch.zeros(n_real, dtype=torch.bool), torch.ones(n_pad, dtype=torch.bool)]
    if hidden not in HIDDEN_VARIANTS:
        raise ValueError(f"unknown hidden-state variant {hidden!r}; expected one of {HIDDEN_VARIANTS}")
    hidden_states = torch.cat(rows)
    is_padding_t = torch.cat(is_padding)

    logits = hidden_states @ gate.T  # the gate is row-wise: padding rows never change real rows' logits
    weights, ids = grouped_topk(logits, spec, bias)
    masked_weights, masked_ids = mask_padded_routes(weights, ids, is_padding_t)
    # Real tokens alone, routed in their own call: the balance the model would have without padding.
    # Their logits are sliced rather than recomputed so that a BLAS kernel choice that depends on the
    # batch size cannot flip a near-tie and blur the comparison.
    _, real_ids = grouped_topk(logits[~is_padding_t], spec, bias)

    e = spec.num_experts
    without = tokens_per_rank(ids, e, ep_size)
    with_plugin = tokens_per_rank(masked_ids, e, ep_size)
    real_only = tokens_per_rank(real_ids, e, ep_size)
    pad_targets = dispatch_targets(ids[is_padding_t], e, ep_size)
    pad_targets_masked = dispatch_targets(masked_ids[is_padding_t], e, ep_size)
    keep = ~is_padding_t
    return {
        "name": f"{spec.name}/ep{ep_size}/{kind}/{hidden}",
        "router": spec.name,
        "ep_size": ep_size,
        "kind": kind,
        "hidden": hidden,
        "real_rows": int(keep.sum()),
        "padded_rows": int(is_padding_t.sum()),
        "padded_rows_dispatched_without_plugin": int(pad_targets.any(dim=1).sum()),
        "padded_rows_dispatched_with_plugin": int(pad_targets_masked.any(dim=1).sum()),
        "padded_sends_without_plugin": int(pad_targets.sum()),
        "padded_tokens_per_rank_without_plugin": pad_targets.sum(dim=0).tolist(),
        "tokens_per_rank_without_plugin": without.tolist(),
        "tokens_per_rank_with_plugin": with_plugin.tolist(),
        "tokens_per_rank_real_only": real_only.tolist(),
        # step time follows the busiest rank: stale padding can lower the ratio (it raises the mean
        # too) while still adding work to every rank, so the absolute maximum is reported as well
        "max_rank_tokens_without_plugin": int(without.max()),
        "max_rank_tokens_with_plugin": int(with_plugin.max()),
        "straggler_without_plugin": straggler_factor(without),
        "straggler_with_plugin": straggler_factor(with_plugin),
        "straggler_real_only": straggler_factor(real_only),
        "busiest_rank_without_plugin": int(without.argmax()),
        "real_rows_bit_identical": bool(
            torch.equal(masked_ids[keep], ids[keep]) and torch.equal(masked_weights[keep], weights[keep])
        ),
    }


def run(cfg: Config | None = None) -> dict[str, Any]:
    """Every router x EP size x padding kind x hidden-state variant; returns the JSON document."""
    cfg = cfg or Config()
    start = time.perf_counter()
    scenarios = [
        run_scenario(spec, ep, kind, hidden, cfg)
        for spec in ROUTERS.values()
        for ep in cfg.ep_sizes
        for kind in KINDS
        for hidden in HIDDEN_VARIANTS
    ]
    return {
        "scenarios": scenarios,
        "config": {
            "ep_sizes": list(cfg.ep_sizes),
            "decode_tokens": list(cfg.decode_tokens),
            "prefill_tokens": list(cfg.prefill_tokens),
            "idle_fraction": cfg.idle_fraction,
            "tp_size": TP_SIZE,
            "max_capture_size": MAX_CAPTURE_SIZE,
            "seed": cfg.seed,
            "routers": {s.name: s.__dict__ for s in ROUTERS.values()},
        },
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "elapsed_s": round(time.perf_counter() - start, 3),
    }


def headline(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Scenarios for the plot: per router, the zero-hidden decode cases at EP 16 (or the largest run)."""
    scenarios = doc["scenarios"]
    ep = 16 if any(s["ep_size"] == 16 for s in scenarios) else max(s["ep_size"] for s in scenarios)
    return [
        s
        for s in scenarios
        if s["ep_size"] == ep and s["hidden"] == "zero" and s["kind"] in ("cudagraph-decode", "dp-dummy-decode")
    ]


def render_table(doc: dict[str, Any]) -> Any:
    """A rich Table of every scenario."""
    from rich.table import Table

    table = Table(title="Expert-parallel balance: padded rows through DeepEP dispatch (CPU simulation)")
    for col, justify in [
        ("router", "left"), ("EP", "right"), ("padding", "left"), ("pad hidden", "left"),
        ("real rows", "right"), ("pad rows", "right"), ("pad dispatched w/o -> with", "right"),
        ("max rank tokens w/o -> with", "right"),
        ("straggler w/o", "right"), ("with plugin", "right"), ("real only", "right"), ("busiest w/o", "right"),
    ]:
        table.add_column(col, justify=justify)
    for s in doc["scenarios"]:
        fixed = s["padded_rows_dispatched_with_plugin"] == 0 and s["straggler_with_plugin"] == s["straggler_real_only"]
        worse = s["straggler_without_plugin"] > 1.05 * s["straggler_real_only"]
        table.add_row(
            s["router"], str(s["ep_size"]), s["kind"], s["hidden"], str(s["real_rows"]), str(s["padded_rows"]),
            f"{s['padded_rows_dispatched_without_plugin']} -> {s['padded_rows_dispatched_with_plugin']}",
            f"{s['max_rank_tokens_without_plugin']} -> {s['max_rank_tokens_with_plugin']}",
            f"[red]{s['straggler_without_plugin']:.3f}[/red]" if worse else f"{s['straggler_without_plugin']:.3f}",
            f"[green]{s['straggler_with_plugin']:.3f}[/green]" if fixed else f"[red]{s['straggler_with_plugin']:.3f}[/red]",
            f"{s['straggler_real_only']:.3f}",
            f"rank {s['busiest_rank_without_plugin']}",
        )
    return table


def plot(doc: dict[str, Any], path: str) -> None:
    """PNG: tokens per EP rank without the plugin (real + padding, stacked) and with it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = headline(doc)
    cols = 2
    rows = -(-len(chosen) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.6 * rows), squeeze=False)
    for ax, s in zip(axes.flat, chosen):
        ranks = list(range(s["ep_size"]))
        real = s["tokens_per_rank_real_only"]
        pad = s["padded_tokens_per_rank_without_plugin"]
        left = [r - 0.2 for r in ranks]
        right = [r + 0.2 for r in ranks]
        ax.bar(left, real, 0.4, color="#4878a8", label="real tokens (without plugin)")
        ax.bar(left, pad, 0.4, bottom=real, color="#c0392b", label="padding rows (without plugin)")
        ax.bar(right, s["tokens_per_rank_with_plugin"], 0.4, color="#2e8b57", label="with plugin (padding masked)")
        ax.set_title(
            f"{s['router']}, EP {s['ep_size']}, {s['kind']}, zero hidden: "
            f"straggler {s['straggler_without_plugin']:.2f} -> {s['straggler_with_plugin']:.2f}",
            fontsize=9,
        )
        ax.set_xlabel("EP rank")
        ax.set_ylabel("tokens received")
        ax.set_xticks(ranks)
        ax.tick_params(axis="x", labelsize=7)
    for ax in list(axes.flat)[len(chosen):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle("Tokens per expert-parallel rank in one DeepEP dispatch (simulated, vllm_padplugin bench balance)",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
