"""GPU proof: the plugin inside REAL vLLM code (0.30 backport, 0.32 native) on CUDA.

Driver (no vLLM import): for each vLLM version it runs, in a fresh process with that
vLLM on PYTHONPATH (laid out by ``.device/install.sh``, see ci/device_pack.py):
  1. ``pytest -m gpu tests/test_gpu_vllm_proof.py`` -- the claims (plugin loaded by vLLM's
     own ``load_general_plugins`` on the real CudaPlatform, mode, masking through the real
     factory + forward context, bit-identity, profiler launch counts, CUDA-graph replays
     with a different padding per replay, legacy runner + DBO with real 0.30 classes);
     each test writes its evidence to JSON;
  2. ``--worker timing``: per-layer routing time of vLLM's router, upstream's path vs the
     plugin's, with / without padding, 16 ... 32768 tokens, under CUDA-graph replay.
Writes ``--json`` (all evidence + timings) and exits non-zero when any claim fails.
``--break-mask`` runs the claims with a deliberately wrong mask kernel (last padded row
of each batch left unmasked): the run must FAIL.

    bash .device/install.sh && source /tmp/padplugin_env.sh
    python3 benchmarks/gpu_vllm_proof.py --json $OUT/gpu_vllm_proof.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSIONS = ("0.30.0", "0.32.0")
TOKENS = (16, 64, 256, 1024, 4096, 16384, 32768)
# DeepSeek-V3 routing
E, G, TOPG, K, H = 256, 8, 4, 8, 64
SCALE = 2.5
PAD_FRACTION = 0.25
# "no slower": plugin median <= upstream median * (1 + REL) + ABS_US (graph-replay noise)
REL, ABS_US = 0.03, 0.2
BREAK_ENV = "PADPLUGIN_PROOF_BREAK"


# ----------------------------------------------------------------- helpers (in a vLLM process)

def break_mask_if_asked() -> None:
    """``--break-mask``: our kernel 'forgets' the last padded row of each batch."""
    if os.environ.get(BREAK_ENV) != "1":
        return
    import torch

    from vllm_padplugin.kernels import triton_mask

    real = triton_mask.mask_padded_routes_inplace

    def broken(w, ids, pad, *, check=True):
        t = ids.shape[0]
        p = pad[:t].clone()
        idx = torch.nonzero(p).flatten()  # host sync: a broken kernel anyway
        if idx.numel():
            p[idx[-1]] = False
        return real(w, ids, p, check=check)

    triton_mask.mask_padded_routes_inplace = broken


def load_plugin_like_vllm() -> dict:
    """Platform resolution + ``load_general_plugins`` exactly as a vLLM worker does."""
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    import vllm.model_executor.layers.fused_moe.layer  # noqa: F401  (router factory patch installs)
    from vllm_padplugin import state

    break_mask_if_asked()
    return {"platform": type(current_platform).__name__, "device_type": current_platform.device_type,
            "is_cuda": bool(current_platform.is_cuda()), "mode": state.STATE.mode,
            "applied_patches": list(state.STATE.applied_patches),
            "general_hook_ran": state.STATE.general_hook_ran}


def deepep_v2_config():
    from vllm.config import ParallelConfig, VllmConfig

    return VllmConfig(parallel_config=ParallelConfig(
        enable_expert_parallel=True, data_parallel_size=2, all2all_backend="deepep_v2"))


def factories():
    """(the factory vLLM's FusedMoE layer calls = ours, upstream's own behind it)."""
    import vllm.model_executor.layers.fused_moe.layer as layer

    ours = layer.create_fused_moe_router
    return ours, getattr(ours, "__padplugin_inner__", ours)


def build_router(factory, *, config=None, device="cuda", **extra):
    """A DeepSeek-V3 grouped router (sigmoid + correction bias) built under ``config``."""
    import torch
    from vllm.config import set_current_vllm_config

    g = torch.Generator().manual_seed(11)
    bias = (torch.rand(E, generator=g) * 0.2 - 0.1).to(device)
    with set_current_vllm_config(config or deepep_v2_config()):
        return factory(top_k=K, global_num_experts=E, use_grouped_topk=True, num_expert_group=G,
                       topk_group=TOPG, scoring_func="sigmoid", renormalize=True,
                       routed_scaling_factor=SCALE, e_score_correction_bias=bias, **extra)


def inputs(t: int, seed: int = 0, device="cuda"):
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, H, generator=g).to(device),
            torch.randn(t, E, generator=g).to(device))  # float32 logits, as DeepSeek-V3's gate


def pad_mask(t: int, n_pad: int, extra: int = 64, device="cuda", seed: int = 1):
    """Persistent-style buffer longer than the batch; the last ``n_pad`` rows are padding
    (rows beyond the batch are random: they must be ignored)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    m = torch.zeros(t + extra, dtype=torch.bool)
    if n_pad:
        m[t - n_pad:t] = True
    m[t:] = torch.rand(extra, generator=g) < 0.5
    return m.to(device)


def route(router, h, logits, is_padding=None, context=True):
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    if not context:
        return router.select_experts(h, logits)
    with set_forward_context(None, VllmConfig(), num_tokens=h.shape[0], is_padding=is_padding):
        return router.select_experts(h, logits)


# ----------------------------------------------------------------- timing worker

def graph_us(fn, target_ms=8.0, repeats=9, max_inner=200) -> float:
    """µs per call under CUDA-graph replay (many calls per graph), median of replays."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    est = (time.perf_counter() - t0) / 3 * 1e3
    inner = int(max(5, min(max_inner, target_ms / max(est, 1e-3))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / inner)
    del graph
    return statistics.median(ts)


def timing_worker(version: str) -> dict:
    """Per-layer routing time (select_experts of vLLM's real GroupedTopKRouter)."""
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    from vllm_padplugin import routing

    env = load_plugin_like_vllm()
    ours, upstream = factories()
    native = env["mode"] == "native"
    variants = {
        "unmasked": build_router(upstream),                       # vLLM without the plugin, no mask
        "plugin": build_router(ours, **({"skip_padding": True} if native else {})),
    }
    if native:  # upstream's own fix: its two out-of-place masked_fill
        variants["upstream_masked"] = build_router(upstream, skip_padding=True)
    else:       # 0.30 has no fix: upstream's masking as of 0.31 (the same two masked_fill)
        r = build_router(upstream)
        inner = r._compute_routing

        def upstream_fix(*a, **k):
            from vllm.forward_context import get_forward_context

            w, ids = inner(*a, **k)
            p = get_forward_context().is_padding[: ids.shape[0]].unsqueeze(1)
            return w.masked_fill(p, 0), ids.masked_fill(p, -1)

        r._compute_routing = upstream_fix
        variants["upstream_masked"] = r
    if os.environ.get("PADPLUGIN_PROOF_FUSED", "1") == "1":
        os.environ[routing.FUSED_TOPK_ENV] = "1"
        variants["plugin_fused_topk"] = build_router(ours, **({"skip_padding": True} if native else {}))
        os.environ.pop(routing.FUSED_TOPK_ENV)
    rows = []
    for t in TOKENS:
        h, logits = inputs(t, seed=t)
        for padded in (0, int(t * PAD_FRACTION)):
            mask = pad_mask(t, padded)
            row = {"tokens": t, "padded": padded}
            ctx = set_forward_context(None, VllmConfig(), num_tokens=t, is_padding=mask)
            with ctx:
                for name, r in variants.items():
                    row[name + "_us"] = graph_us(lambda r=r: r.select_experts(h, logits))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"env": env, "variants": list(variants), "rows": rows,
            "impl": {k: getattr(v, routing.IMPL_ATTR, None) for k, v in variants.items()},
            "fused": {k: getattr(v, routing.FUSED_ATTR, False) for k, v in variants.items()}}


def extra_launches(base: list[str], ours: list[str]) -> list[str]:
    """Device ops in ``ours`` beyond ``base`` (multiset difference, names kept)."""
    from collections import Counter

    return list((Counter(ours) - Counter(base)).elements())


def launch_claim(base: list[str], ours: list[str]) -> str | None:
    """None when the plugin's masking adds exactly one launch, our ``_mask_rows_kernel``
    (no copy, no masked_fill).  Note: vLLM's own grouped_topk compiles to an inductor kernel
    whose NAME contains 'masked_fill' (its group mask): that one is in both lists."""
    extra = extra_launches(base, ours)
    if len(ours) != len(base) + 1 or len(extra) != 1 or "_mask_rows_kernel" not in extra[0]:
        return f"plugin masking adds {extra} ({len(ours) - len(base)} launches), claimed [_mask_rows_kernel]"
    return None


def recheck(path: Path) -> int:
    """Re-evaluate the launch claim on a committed proof JSON (no GPU needed)."""
    rep = json.loads(path.read_text())
    rc = 0
    for ver, vrep in rep["versions"].items():
        la = (vrep.get("evidence") or {}).get("launches", {})
        why = launch_claim(la["unmasked"]["names"], la["plugin"]["names"])
        up = extra_launches(la["unmasked"]["names"], la["upstream_masked"]["names"]) if "upstream_masked" in la else None
        print(f"vLLM {ver}: plugin adds {extra_launches(la['unmasked']['names'], la['plugin']['names'])}"
              + ("" if up is None else f"; upstream's masking adds {len(up)}: {[u[:60] for u in up]}")
              + f" -> {'OK' if why is None else 'FAIL ' + why}")
        rc |= why is not None
    return rc


def timing_claims(res: dict) -> list[dict]:
    out = []
    for row in res["rows"]:
        up, ours = row["upstream_masked_us"], row["plugin_us"]
        ok = ours <= up * (1 + REL) + ABS_US
        out.append({"claim": f"plugin no slower than upstream's masking at T={row['tokens']} "
                             f"padded={row['padded']}", "ok": ok, "plugin_us": ours, "upstream_us": up})
    return out


# ----------------------------------------------------------------- driver

def vllm_env(version: str, extra: dict | None = None) -> dict:
    root = os.environ.get(f"PADPLUGIN_VLLM_{version.replace('.', '_')}")
    if not root:
        sys.exit(f"PADPLUGIN_VLLM_{version.replace('.', '_')} unset: source /tmp/padplugin_env.sh "
                 "(written by .device/install.sh)")
    path = [root, os.environ["PADPLUGIN_DEVICE_SITE"], os.environ["PADPLUGIN_DEVICE_META"], str(REPO)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), VLLM_USE_FUSED_MOE_GROUPED_TOPK="0",
               PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra or {})
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "gpu_vllm_proof.json")
    ap.add_argument("--versions", nargs="*", default=list(VERSIONS))
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--break-mask", action="store_true", help="sabotage the kernel: must exit non-zero")
    ap.add_argument("--worker", choices=["timing"])
    ap.add_argument("--version")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--recheck", type=Path, help="re-evaluate the launch claim on a proof JSON")
    args = ap.parse_args()
    if args.recheck:
        return recheck(args.recheck)
    if args.worker == "timing":
        res = timing_worker(args.version)
        args.out.write_text(json.dumps(res, indent=1))
        return 0

    report: dict = {"device": None, "versions": {}, "break_mask": args.break_mask}
    try:
        import torch

        report["device"] = torch.cuda.get_device_name(0)
        report["torch"], report["cuda"] = torch.__version__, torch.version.cuda
        import triton

        report["triton"] = triton.__version__
    except Exception as exc:
        report["device"] = f"unavailable: {exc}"
    rc = 0
    extra = {BREAK_ENV: "1"} if args.break_mask else {}
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="padplugin-proof-"))  # per-process parts, merged below
    for ver in args.versions:
        vrep: dict = {}
        ev = work / f"evidence_{ver}.json"
        env = vllm_env(ver, dict(extra, PADPLUGIN_PROOF_JSON=str(ev)))
        t0 = time.time()
        p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "gpu",
                            "-rA", str(REPO / "tests" / "test_gpu_vllm_proof.py")], env=env, cwd=REPO)
        vrep["pytest_rc"], vrep["pytest_s"] = p.returncode, round(time.time() - t0, 1)
        vrep["evidence"] = json.loads(ev.read_text()) if ev.exists() else None
        if p.returncode != 0:
            rc = 1
        if not args.no_timing and not args.break_mask:
            out = work / f"timing_{ver}.json"
            t0 = time.time()
            q = subprocess.run([sys.executable, __file__, "--worker", "timing", "--version", ver,
                                "--out", str(out)], env=env, cwd=REPO)
            vrep["timing_s"] = round(time.time() - t0, 1)
            if q.returncode != 0 or not out.exists():
                vrep["timing"] = {"error": f"worker rc={q.returncode}"}
                rc = 1
            else:
                vrep["timing"] = json.loads(out.read_text())
                vrep["timing_claims"] = timing_claims(vrep["timing"])
                if not all(c["ok"] for c in vrep["timing_claims"]):
                    rc = 1
        report["versions"][ver] = vrep
    report["ok"] = rc == 0
    args.json.write_text(json.dumps(report, indent=1))
    # table last (the device reply carries the tail)
    for ver, vrep in report["versions"].items():
        print(f"\n== vLLM {ver}: pytest rc={vrep['pytest_rc']} ({vrep['pytest_s']} s)")
        tim = vrep.get("timing") or {}
        if tim.get("rows"):
            names = [n for n in tim["variants"]]
            print("tokens padded " + " ".join(f"{n + ' µs':>22}" for n in names))
            for row in tim["rows"]:
                print(f"{row['tokens']:>6} {row['padded']:>6} " + " ".join(f"{row[n + '_us']:>22.2f}" for n in names))
            bad = [c for c in vrep["timing_claims"] if not c["ok"]]
            print(f"timing claims: {len(vrep['timing_claims']) - len(bad)}/{len(vrep['timing_claims'])} ok"
                  + "".join(f"\n  FAIL {c['claim']}: {c['plugin_us']:.2f} vs {c['upstream_us']:.2f}" for c in bad))
    print(f"\nPROOF {'PASSED' if rc == 0 else 'FAILED'} (exit {rc}); json: {args.json}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
