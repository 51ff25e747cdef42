"""Expert-parallel MoE layer step over NCCL: route -> mask -> dispatch -> expert GEMMs -> combine.

One process per GPU = one EP rank.  DeepEP cannot be installed on the lent machines (its
wheel needs another torch/Python), so dispatch and combine are ``all_to_all_single``
over NCCL with DeepEP's rule: a token goes once to every rank that owns at least one of
its expert ids, and id ``-1`` (the plugin's mask on padded rows) goes nowhere.  Each
rank runs its local experts (bf16, DeepSeek-V3 sizes by default) on the rows it
received, weights them, and sends them back; the sender sums them.

Per rank: real tokens + padded rows at the end (zero hidden states: they all route to
the same experts, the straggler of vLLM PR #56079).  Measured with and without the
plugin's masking (the one-launch Triton kernel on CUDA); reported: step time = max over
ranks, each phase, and per-rank busy time.  ``--check`` (small sizes) compares the
combined output with a dense single-process MoE and checks padded rows come back 0.

    python benchmarks/ep_step_nccl.py --world-size 1 --check          # spawns the ranks itself
    torchrun --nproc-per-node N benchmarks/ep_step_nccl.py --json ep_nccl.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# NVLink multicast stays off on the lent multi-GPU machines (shared hosts): keep these set.
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)


def expert_weights(e: int, hidden: int, inter: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic per-expert weights: any rank can rebuild any expert (for --check)."""
    g = torch.Generator(device=dev).manual_seed(1000 + e)
    w13 = (torch.randn(2 * inter, hidden, generator=g, device=dev) * hidden**-0.5).to(torch.bfloat16)
    w2 = (torch.randn(hidden, inter, generator=g, device=dev) * inter**-0.5).to(torch.bfloat16)
    return w13, w2


def expert_mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = x @ w13.t()
    inter = w2.shape[1]
    return (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ w2.t()


class _Mark:
    """A CUDA event on GPUs; a host clock after a barrier-free sync on CPU (gloo test runs)."""

    def __init__(self, dev):
        if dev.type == "cuda":
            self.ev = torch.cuda.Event(enable_timing=True)
            self.ev.record()
        else:
            self.ev, self.t = None, time.perf_counter()

    def elapsed_time(self, other: "_Mark") -> float:
        """Milliseconds from self to other (same convention as torch.cuda.Event)."""
        if self.ev is not None:
            return self.ev.elapsed_time(other.ev)
        return (other.t - self.t) * 1e3


class Rank:
    def __init__(self, args, rank: int, world: int, dev):
        self.args, self.rank, self.world, self.dev = args, rank, world, dev
        E = args.num_experts
        if E % world:
            raise SystemExit(f"{E} experts do not split over {world} ranks")
        self.per = E // world
        self.lo = rank * self.per
        ws = [expert_weights(self.lo + j, args.hidden, args.inter, dev) for j in range(self.per)]
        self.w13 = [w[0] for w in ws]
        self.w2 = [w[1] for w in ws]
        g = torch.Generator(device=dev).manual_seed(7)  # same gate and bias on every rank
        self.gate = torch.randn(E, args.hidden, generator=g, device=dev) * args.hidden**-0.5
        self.bias = torch.randn(E, generator=g, device=dev) * 0.01
        g = torch.Generator(device=dev).manual_seed(100 + rank)
        T, P = args.tokens, int(args.tokens * args.pad_fraction)
        self.x = (torch.randn(T, args.hidden, generator=g, device=dev)).to(torch.bfloat16)
        self.x[T - P:] = 0  # padded rows: zero hidden states
        self.is_padding = torch.zeros(T + 64, dtype=torch.bool, device=dev)  # persistent, longer than batch
        self.is_padding[T - P:T] = True

    def route(self, mask: bool):
        from vllm_padplugin.kernels.reference import grouped_topk_reference
        from vllm_padplugin.kernels.triton_mask import mask_padded_routes_inplace

        a = self.args
        logits = self.x.float() @ self.gate.t()
        w, ids = grouped_topk_reference(logits, self.bias, topk=a.topk, num_expert_group=a.groups,
                                        topk_group=a.topk_group, routed_scaling_factor=a.scale)
        if mask:
            mask_padded_routes_inplace(w, ids, self.is_padding)
        return w, ids

    def step(self, mask: bool, ev: dict | None = None):
        """One MoE layer step; returns the combined output [T, hidden] (bf16) and stats."""
        def mark(name):
            if ev is not None:
                ev[name] = _Mark(self.dev)

        W = self.world
        mark("start")
        w, ids = self.route(mask)
        mark("routed")
        owner = torch.where(ids >= 0, torch.div(ids, self.per, rounding_mode="floor"), -1).long()
        dest = torch.zeros(ids.shape[0], W + 1, dtype=torch.bool, device=self.dev)
        dest.scatter_(1, torch.where(owner >= 0, owner, W), True)
        dest = dest[:, :W]
        rank_of, tok = dest.t().nonzero(as_tuple=True)  # grouped by destination rank
        send_counts = torch.bincount(rank_of, minlength=W)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        sc, rc = send_counts.tolist(), recv_counts.tolist()  # host sync: split sizes (DeepEP notifies too)
        n_recv = sum(rc)
        recv_x = torch.empty(n_recv, self.args.hidden, dtype=torch.bfloat16, device=self.dev)
        recv_ids = torch.empty(n_recv, ids.shape[1], dtype=ids.dtype, device=self.dev)
        recv_w = torch.empty(n_recv, ids.shape[1], dtype=w.dtype, device=self.dev)
        dist.all_to_all_single(recv_x, self.x[tok].contiguous(), rc, sc)
        dist.all_to_all_single(recv_ids, ids[tok].contiguous(), rc, sc)
        dist.all_to_all_single(recv_w, w[tok].contiguous(), rc, sc)
        mark("dispatched")
        # local experts on the rows received: (row, slot) pairs grouped by expert
        local = (recv_ids >= self.lo) & (recv_ids < self.lo + self.per)
        row, slot = local.nonzero(as_tuple=True)
        eid = (recv_ids[row, slot] - self.lo).long()
        order = torch.argsort(eid, stable=True)
        row, slot, eid = row[order], slot[order], eid[order]
        counts = torch.bincount(eid, minlength=self.per).tolist()
        out = torch.zeros(n_recv, self.args.hidden, dtype=torch.float32, device=self.dev)
        start = 0
        for j, n in enumerate(counts):
            if n:
                r, s = row[start:start + n], slot[start:start + n]
                y = expert_mlp(recv_x[r], self.w13[j], self.w2[j]).float() * recv_w[r, s].unsqueeze(1)
                out.index_add_(0, r, y)
                start += n
        mark("experts")
        back = torch.empty(int(sum(sc)), self.args.hidden, dtype=torch.bfloat16, device=self.dev)
        dist.all_to_all_single(back, out.to(torch.bfloat16), sc, rc)
        y = torch.zeros(self.x.shape[0], self.args.hidden, dtype=torch.float32, device=self.dev)
        y.index_add_(0, tok, back.float())
        mark("combined")
        return y.to(torch.bfloat16), {"rows_received": n_recv, "gemm_rows": int(sum(counts)),
                                      "padded_rows_sent": int(dest[self.is_padding[: ids.shape[0]]].any(1).sum())}

    def dense_reference(self, mask: bool) -> torch.Tensor:
        """Single-process MoE of this rank's tokens with every expert (small sizes only)."""
        w, ids = self.route(mask)
        y = torch.zeros(self.x.shape[0], self.args.hidden, dtype=torch.float32, device=self.dev)
        for e in ids.unique().tolist():
            if e < 0:
                continue
            w13, w2 = expert_weights(e, self.args.hidden, self.args.inter, self.dev)
            t, s = (ids == e).nonzero(as_tuple=True)
            y.index_add_(0, t, expert_mlp(self.x[t], w13, w2).float() * w[t, s].unsqueeze(1))
        return y.to(torch.bfloat16)


def worker(local_rank: int, args, world: int) -> None:
    rank = int(os.environ.get("RANK", local_rank))
    if args.cpu:  # gloo on CPU: exercises the dispatch/combine logic for N > 1 without GPUs
        dev = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    else:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    try:
        _run(args, rank, world, dev)
    finally:
        dist.destroy_process_group()


def _run(args, rank: int, world: int, dev) -> None:
    me = Rank(args, rank, world, dev)
    doc = {"world_size": world, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (gloo)", "tokens_per_rank": args.tokens,
           "pad_fraction": args.pad_fraction, "num_experts": args.num_experts, "hidden": args.hidden,
           "inter": args.inter, "topk": args.topk, "dispatch": ("gloo" if args.cpu else "NCCL") + " all_to_all_single (DeepEP not installable)"}
    if args.check:
        checks = {}
        for mask in (False, True):
            y, stats = me.step(mask)
            ref = me.dense_reference(mask)
            err = ((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12)).item()
            pad = me.is_padding[: y.shape[0]]
            checks["masked" if mask else "unmasked"] = {
                "rel_err_vs_dense": err, "padded_rows_out_zero": bool((y[pad] == 0).all()), **stats}
        gathered = [None] * world
        dist.all_gather_object(gathered, checks)
        doc["check"] = gathered
    for mask in (False, True):
        phases = {"route": [], "dispatch": [], "experts": [], "combine": [], "step": []}
        for it in range(args.warmup + args.iters):
            dist.barrier()
            ev: dict = {}
            _, stats = me.step(mask, ev)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if it >= args.warmup:
                phases["route"].append(ev["start"].elapsed_time(ev["routed"]) * 1e3)
                phases["dispatch"].append(ev["routed"].elapsed_time(ev["dispatched"]) * 1e3)
                phases["experts"].append(ev["dispatched"].elapsed_time(ev["experts"]) * 1e3)
                phases["combine"].append(ev["experts"].elapsed_time(ev["combined"]) * 1e3)
                phases["step"].append(ev["start"].elapsed_time(ev["combined"]) * 1e3)
        med = {k: statistics.median(v) for k, v in phases.items()}
        t = torch.tensor([med[k] for k in phases], device=dev, dtype=torch.float64)
        all_t = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(all_t, t)
        per_rank = [dict(zip(phases, x.tolist())) for x in all_t]
        all_stats = [None] * world
        dist.all_gather_object(all_stats, stats)
        doc["masked" if mask else "unmasked"] = {
            "step_us_max_over_ranks": max(p["step"] for p in per_rank),
            "experts_us_max_over_ranks": max(p["experts"] for p in per_rank),
            "experts_us_mean": statistics.fmean(p["experts"] for p in per_rank),
            "per_rank_us": per_rank, "per_rank_stats": all_stats}
    doc["speedup_step"] = doc["unmasked"]["step_us_max_over_ranks"] / doc["masked"]["step_us_max_over_ranks"]
    if rank == 0:
        print(json.dumps({k: v for k, v in doc.items() if k not in ("masked", "unmasked")}, indent=1))
        for m in ("unmasked", "masked"):
            d = doc[m]
            print(f"{m:>9}: step {d['step_us_max_over_ranks']:.1f} µs (max over {world} ranks); experts max "
                  f"{d['experts_us_max_over_ranks']:.1f} mean {d['experts_us_mean']:.1f} µs; rank stats {d['per_rank_stats']}")
        print(f"speed-up of masking (step): {doc['speedup_step']:.3f}")
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=None, help="spawn this many ranks (default: torchrun's)")
    ap.add_argument("--tokens", type=int, default=512, help="rows per rank, padding included")
    ap.add_argument("--pad-fraction", type=float, default=0.25)
    ap.add_argument("--num-experts", type=int, default=256)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--topk-group", type=int, default=4)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--scale", type=float, default=2.5)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--check", action="store_true", help="compare with a dense MoE (use small --hidden/--inter)")
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU (logic check of N > 1 without GPUs)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        worker(int(os.environ.get("LOCAL_RANK", 0)), args, int(os.environ["WORLD_SIZE"]))
        return 0
    world = args.world_size or 1
    if not args.cpu and torch.cuda.device_count() < world:
        print(f"ep_step_nccl: {world} ranks need {world} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.multiprocessing.spawn(worker, args=(args, world), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
