"""What serving the fused grouped top-k for 16-bit router logits would change (issue 11).

The router takes the fused kernel for float32 logits only (``routing.py``); with bf16 / fp16
logits upstream's grouped top-k routes and the plugin only masks.  The reason, measured here:
the kernel computes a 16-bit logit's sigmoid in float32, upstream's grouped top-k in the
logits' own dtype.  This runs vLLM's ``grouped_topk`` (the installed vLLM's Python function
and its ``@torch.compile``: its torch path, the one it takes off CUDA) and the plugin's
float32 reference (the kernel's semantics; the GPU tests hold the kernel to it) on the same
logits (``gpu_masking.routing_inputs``: N(0, 1) logits, bias N(0, 0.05)) and prints, per
router and dtype, the rows whose expert SET differs and the largest weight difference.
float32 is the control.  On CUDA upstream calls its compiled op instead (not run here: no
CUDA build of vLLM on these machines).

    python benchmarks/logits16_semantics.py --tokens 4096 --json logits16_semantics.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_masking import ROUTERS, routing_inputs  # noqa: E402

from vllm_padplugin.kernels.reference import grouped_topk_reference  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def compare(T: int, router: dict, dtype: torch.dtype, seed: int) -> dict:
    from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import grouped_topk

    E, G, TG, K, scale = (router[k] for k in ("num_experts", "num_expert_group", "topk_group", "topk", "scale"))
    logits, bias, _ = routing_inputs(T, E, dtype, torch.Generator().manual_seed(seed), "cpu")
    vw, vi = grouped_topk(torch.zeros(T, 1), logits, K, True, num_expert_group=G, topk_group=TG,
                          scoring_func="sigmoid", routed_scaling_factor=scale, e_score_correction_bias=bias)
    rw, ri = grouped_topk_reference(logits, bias, topk=K, num_expert_group=G, topk_group=TG,
                                    routed_scaling_factor=scale)
    vi, ri = vi.long(), ri.long()
    same = (vi.sort(1).values == ri.sort(1).values).all(1)
    # weights compared per expert id, on the rows where the sets agree
    vws = torch.zeros(T, E).scatter_(1, vi, vw.float())[same]
    rws = torch.zeros(T, E).scatter_(1, ri, rw.float())[same]
    d = (vws - rws).abs()
    return {"rows": T, "rows_other_set": int((~same).sum()), "max_abs_weight_diff": float(d.max()),
            "max_rel_weight_diff": float((d / rws.abs().clamp_min(1e-30))[rws > 0].max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    import vllm

    rows = []
    print(f"vLLM {vllm.__version__}'s grouped_topk (torch path) against float32 arithmetic, {a.tokens} rows")
    print(f"{'router':<12} {'logits':<6} {'rows, other set':>16} {'max |dw|':>10} {'max |dw|/w':>11}")
    for name, router in ROUTERS.items():
        for dname, dt in DTYPES.items():
            r = dict(router=name, logits=dname, **compare(a.tokens, router, dt, a.seed))
            rows.append(r)
            print(f"{name:<12} {dname:<6} {r['rows_other_set']:>16} {r['max_abs_weight_diff']:>10.2e} "
                  f"{r['max_rel_weight_diff']:>11.2e}")
    if a.json:
        a.json.write_text(json.dumps({"vllm": vllm.__version__, "torch": torch.__version__, "seed": a.seed,
                                      "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
