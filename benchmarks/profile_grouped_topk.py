"""Launches to profile under Nsight Compute: the fused grouped top-k without mask, with
the mask (25 % of rows padded) and with the mask but no row padded, per size and dtype.

    ncu --clock-control none -k regex:_grouped_topk_kernel \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,gpu__time_duration.sum \
        python3 benchmarks/profile_grouped_topk.py

Launch order (ncu lists them in this order): for each (router, dtype, T) in CASES:
no mask, mask 25 %, mask none padded.  The kernel reads 1 byte per token more with the
mask, and padded rows skip their logits above 1024 tokens; what else the mask costs shows
as executed instructions.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vllm_padplugin.kernels.triton_grouped_topk import fused_grouped_topk  # noqa: E402

CASES = [("deepseek-v3", torch.float32, 32768), ("deepseek-v3", torch.bfloat16, 32768),
         ("deepseek-v3", torch.float32, 4096), ("kimi-style", torch.float32, 32768)]
ROUTER = {"deepseek-v3": (256, 8, 4, 8, 2.5), "kimi-style": (384, 1, 1, 8, 2.827)}


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    for router, dtype, T in CASES:
        E, G, TG, K, scale = ROUTER[router]
        x = torch.randn(T, E, generator=g, device="cuda").to(dtype)
        b = torch.randn(E, generator=g, device="cuda") * 0.05
        mask = torch.zeros(T, dtype=torch.bool, device="cuda")
        mask[T - T // 4:] = True
        none = torch.zeros_like(mask)
        kw = dict(topk=K, num_expert_group=G, topk_group=TG, routed_scaling_factor=scale)
        for m in (None, mask, none):
            fused_grouped_topk(x, b, is_padding=m, **kw)
        torch.cuda.synchronize()
        print(router, dtype, T, "launched: no mask, mask 25 %, mask none padded", flush=True)


if __name__ == "__main__":
    main()
