"""The plugin inside REAL vLLM on a CUDA GPU (run by benchmarks/gpu_vllm_proof.py per version).

Real: vLLM's CudaPlatform (platform resolution with pynvml), vLLM's own
``load_general_plugins`` loading us through entry points, vLLM's router factory, its
GroupedTopKRouter (DeepSeek-V3 routing, vLLM's torch.compile'd grouped_topk -- the
compiled ``_moe_C`` op is absent, ``VLLM_USE_FUSED_MOE_GROUPED_TOPK=0``), VllmConfig /
ParallelConfig choosing DeepEP v2 + expert parallel, set_forward_context with
is_padding, torch.profiler, CUDA graphs, and (0.30) the real GPUModelRunner module /
UBatchWrapper class with the backport patches the plugin applied on import.

Not real (cannot be, on one GPU without an engine): DeepEP itself (not installed; dispatch
is not exercised, routing is), the DP=2 process group (the config says DP=2; the forward
context uses DP=1 as a single process must), the runner/wrapper ``__init__`` (needs a
model and an engine: instances are made with ``object.__new__``; the runner's
execute_model body is a stand-in that calls the module's real ``set_forward_context``
as upstream's does).  Each test writes what it saw to $PADPLUGIN_PROOF_JSON.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
EVIDENCE: dict = {}


def _version() -> tuple[int, int]:
    import vllm

    major, minor = str(vllm.__version__).split(".")[:2]
    return int(major), int(minor)


@pytest.fixture(scope="module")
def proof():
    pytest.importorskip("vllm")
    import gpu_vllm_proof as P
    import vllm

    EVIDENCE["vllm"] = vllm.__version__
    EVIDENCE["vllm_file"] = vllm.__file__
    EVIDENCE["load"] = P.load_plugin_like_vllm()
    yield P
    out = os.environ.get("PADPLUGIN_PROOF_JSON")
    if out:
        Path(out).write_text(json.dumps(EVIDENCE, indent=1, default=str))


def _native() -> bool:
    return _version() >= (0, 31)


def _plugin_router(P):
    ours, _ = P.factories()
    return P.build_router(ours, **({"skip_padding": True} if _native() else {}))


def assert_masked(w, ids, rw, rids, pad):
    t = ids.shape[0]
    p = pad[:t].cpu()
    w, ids, rw, rids = w.cpu(), ids.cpu(), rw.cpu(), rids.cpu()
    assert torch.all(ids[p] == -1) and torch.all(w[p] == 0), "padded rows not masked"
    assert torch.equal(ids[~p], rids[~p]), "non-padded ids changed"
    assert torch.equal(w[~p].view(torch.int32), rw[~p].view(torch.int32)), "non-padded weights not bit-identical"


def test_loaded_by_vllm_on_cuda_platform(proof):
    from vllm import envs

    from vllm_padplugin import routing

    ev = EVIDENCE["load"]
    assert ev["is_cuda"] and ev["device_type"] == "cuda" and "Cuda" in ev["platform"], ev
    assert ev["general_hook_ran"]
    assert ev["mode"] == ("native" if _native() else "backport"), ev
    want = {"native_fast_mask"} if _native() else {"router_factory", "legacy_runner_mask", "dbo_mask"}
    assert want <= set(ev["applied_patches"]), ev
    cfg = proof.deepep_v2_config()
    assert cfg.parallel_config.all2all_backend == "deepep_v2"
    assert routing.deepep_v2_active(cfg), "vLLM's FusedMoEParallelConfig says no DeepEP v2"
    EVIDENCE["deepep_v2_kernels_by_vllm_config"] = True
    EVIDENCE["deep_ep_installed"] = importlib.util.find_spec("deep_ep") is not None
    EVIDENCE["fallbacks"] = {
        "VLLM_USE_FUSED_MOE_GROUPED_TOPK": bool(envs.VLLM_USE_FUSED_MOE_GROUPED_TOPK),
        "vllm._C present": importlib.util.find_spec("vllm._C") is not None,
        "_moe_C ops registered": hasattr(torch.ops, "_moe_C") and hasattr(torch.ops._moe_C, "grouped_topk"),
        "grouped_topk": "vLLM's Python grouped_topk under torch.compile (inductor/Triton)",
    }


@pytest.mark.parametrize("t,n_pad", [(203, 37), (16, 16), (64, 0), (4096, 1024)])
def test_padded_rows_masked_others_bit_identical(proof, t, n_pad):
    from vllm_padplugin import routing

    P = proof
    _, upstream = P.factories()
    router = _plugin_router(P)
    assert type(router).__name__ == "GroupedTopKRouter"
    assert getattr(router, routing.MASKED_ATTR, False), "plugin did not take the masking"
    assert getattr(router, routing.IMPL_ATTR) == "triton", "fast path not selected on CUDA"
    if _native():
        assert router.skip_padding is False, "upstream would mask a second time"
    ref = P.build_router(upstream)
    h, logits = P.inputs(t, seed=t)
    pad = P.pad_mask(t, n_pad)
    w, ids = P.route(router, h, logits, pad)
    rw, rids = P.route(ref, h, logits, context=False)
    assert_masked(w, ids, rw, rids, pad)
    EVIDENCE.setdefault("masking", []).append({"tokens": t, "padded": n_pad, "ok": True,
                                               "impl": getattr(router, routing.IMPL_ATTR),
                                               "ids_dtype": str(ids.dtype), "w_dtype": str(w.dtype)})


def _kernels(fn):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def test_launch_counts_no_double_masking(proof):
    P = proof
    _, upstream = P.factories()
    t = 512
    h, logits = P.inputs(t, seed=5)
    pad = P.pad_mask(t, 128)
    unmasked = P.build_router(upstream)
    base = _kernels(lambda: P.route(unmasked, h, logits, pad))
    plugin_router = _plugin_router(P)
    ours = _kernels(lambda: P.route(plugin_router, h, logits, pad))
    rec = {"unmasked": base, "plugin": ours}
    if _native():
        up_router = P.build_router(upstream, skip_padding=True)
        rec["upstream_masked"] = _kernels(lambda: P.route(up_router, h, logits, pad))
    EVIDENCE["launches"] = {k: {"count": len(v), "names": v} for k, v in rec.items()}
    if _native():
        EVIDENCE["launches"]["upstream_masking_adds"] = P.extra_launches(base, rec["upstream_masked"])
    # exactly one extra launch, ours; no masked_fill / copy beyond the unmasked router's own
    # (vLLM's compiled grouped_topk has a kernel NAMED ...masked_fill... in both lists)
    why = P.launch_claim(base, ours)
    assert why is None, why


def test_cuda_graph_replays_with_different_padding(proof):
    """Capture select_experts once; between replays write another padding into the persistent
    mask buffer (in place, as the runner does); every replay is right, nothing recaptured."""
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    P = proof
    _, upstream = P.factories()
    t = 256
    router, ref = _plugin_router(P), P.build_router(upstream)
    h, logits = P.inputs(t, seed=9)
    rw, rids = P.route(ref, h, logits, context=False)
    buf = torch.zeros(t + 64, dtype=torch.bool, device="cuda")
    view = buf[:t]
    with set_forward_context(None, VllmConfig(), num_tokens=t, is_padding=view):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                router.select_experts(h, logits)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            w, ids = router.select_experts(h, logits)
    gen = torch.Generator().manual_seed(3)
    patterns = {"none": torch.zeros(t, dtype=torch.bool), "tail 5": torch.arange(t) >= t - 5,
                "tail 100": torch.arange(t) >= t - 100, "random 40%": torch.rand(t, generator=gen) < 0.4,
                "all": torch.ones(t, dtype=torch.bool), "none again": torch.zeros(t, dtype=torch.bool)}
    seen = []
    for name, pat in patterns.items():
        buf[:t].copy_(pat.cuda())
        buf[t:].fill_(True)  # beyond the batch: ignored
        g.replay()
        torch.cuda.synchronize()
        assert_masked(w, ids, rw, rids, pat)
        seen.append({"pattern": name, "padded": int(pat.sum()), "ok": True})
    EVIDENCE["cuda_graph"] = {"tokens": t, "replays": seen, "captures": 1}


def _runner_module():
    try:
        import vllm.v1.worker.gpu_model_runner as module
    except Exception as exc:
        EVIDENCE.setdefault("not_constructed", []).append(f"gpu_model_runner import: {type(exc).__name__}: {exc}")
        pytest.skip(f"vLLM's GPU runner module does not import here: {exc}")
    return module


def test_legacy_runner_fills_mask_router_masks(proof):
    """0.30: the plugin patched the real GPUModelRunner on import; its persistent CUDA mask is
    filled per step and the router masks from it.  0.32: upstream fills it, patch not applied."""
    from vllm_padplugin.patches import legacy_runner_mask as lrm

    P = proof
    module = _runner_module()
    if _native():
        assert lrm.runner_fills_mask(module.GPUModelRunner)
        assert not lrm._is_ours(inspect.getattr_static(module.GPUModelRunner, "execute_model"))
        EVIDENCE["legacy_runner"] = "native (0.31+): upstream fills is_padding; backport not applied"
        return
    assert lrm._is_ours(inspect.getattr_static(module.GPUModelRunner, "execute_model")), "not patched on import"
    assert lrm._is_ours(module.set_forward_context)
    _, upstream = P.factories()
    router, ref = _plugin_router(P), P.build_router(upstream)
    from vllm.config import VllmConfig

    cfg = VllmConfig()  # the forward context is DP=1 (a DP=2 one all-reduces across ranks)
    seen = []

    def execute_model(self, scheduler_output, intermediate_tensors=None):  # stand-in body
        from vllm.forward_context import get_forward_context

        t = self.pad_to
        with module.set_forward_context(None, cfg, num_tokens=t):
            mask = get_forward_context().is_padding
            h, logits = P.inputs(t, seed=t)
            w, ids = router.select_experts(h, logits)
        seen.append((mask.clone(), mask.data_ptr(), w, ids, *P.route(ref, h, logits, context=False)))

    sub = type("GPUModelRunnerUnderProof", (module.GPUModelRunner,), {"execute_model": execute_model})
    lrm.patch_legacy_runner(module, sub)
    runner = object.__new__(sub)
    runner.max_num_tokens, runner.device = 1024, torch.device("cuda")
    import dataclasses

    from vllm.v1.core.sched.output import SchedulerOutput

    steps = [(100, 128), (128, 128), (3, 64)]
    for real, padded in steps:
        runner.pad_to = padded
        runner.execute_model(dataclasses.replace(SchedulerOutput.make_empty(), total_num_scheduled_tokens=real))
    buf = runner.__dict__[lrm.MASK_ATTR].buffer
    assert buf.is_cuda and {s[1] for s in seen} == {buf.data_ptr()}, "one persistent CUDA buffer"
    for (real, padded), (mask, _, w, ids, rw, rids) in zip(steps, seen):
        assert mask.tolist() == [False] * real + [True] * (padded - real)
        assert_masked(w, ids, rw, rids, mask)
    EVIDENCE["legacy_runner"] = {"steps": steps, "buffer_rows": buf.shape[0], "device": str(buf.device),
                                 "ok": True, "fake": "object.__new__ instance; execute_model body stand-in"}


def test_dbo_micro_batches_masked(proof):
    """0.30: the real UBatchWrapper (patched by the plugin on import) gives each micro-batch
    context its slice of the CUDA mask; the router masks each micro-batch from it."""
    from vllm_padplugin.patches import dbo_mask
    from vllm_padplugin.patches.legacy_runner_mask import _is_ours

    P = proof
    try:
        import vllm.v1.worker.gpu_ubatch_wrapper as module
        from vllm.v1.worker.ubatch_utils import UBatchSlice
    except Exception as exc:
        EVIDENCE.setdefault("not_constructed", []).append(f"gpu_ubatch_wrapper import: {exc}")
        pytest.skip(f"UBatchWrapper does not import here: {exc}")
    if _native():
        assert dbo_mask.builder_propagates(module.UBatchWrapper)
        EVIDENCE["dbo"] = "native (0.31+): upstream slices the mask; backport not applied"
        return
    assert _is_ours(inspect.getattr_static(module.UBatchWrapper, "_make_ubatch_metadata")), "not patched"
    from vllm.config import CUDAGraphMode, VllmConfig
    from vllm.forward_context import override_forward_context, set_forward_context

    cfg = VllmConfig()
    w0 = object.__new__(module.UBatchWrapper)
    w0.vllm_config, w0.comm_stream, w0.ready_barrier = cfg, None, threading.Barrier(3)
    t = 96
    outer = torch.zeros(t + 32, dtype=torch.bool, device="cuda")
    outer[80:t] = True
    slices = [UBatchSlice(slice(0, 2), slice(0, 48)), UBatchSlice(slice(2, 3), slice(48, t))]
    ids_in = torch.arange(t, device="cuda")
    with set_forward_context(None, cfg, num_tokens=t, ubatch_slices=slices, is_padding=outer[:t]):
        metadata = w0._make_ubatch_metadata(
            ubatch_slices=slices, attn_metadata=None, slot_mapping=None, input_ids=ids_in,
            positions=ids_in.clone(), inputs_embeds=None, intermediate_tensors=None,
            compute_stream=None, dp_metadata=[None] * 2, batch_descriptor=None,
            cudagraph_runtime_mode=CUDAGraphMode.NONE)
    _, upstream = P.factories()
    router, ref = _plugin_router(P), P.build_router(upstream)
    h, logits = P.inputs(t, seed=21)
    rw, rids = P.route(ref, h, logits, context=False)
    res = []
    for m, s in zip(metadata, slices):
        ctx = m.context.forward_context
        sl = s.token_slice
        assert ctx.is_padding is not None and ctx.is_padding.data_ptr() == outer.data_ptr() + sl.start
        with override_forward_context(ctx):
            w, ids = router.select_experts(h[sl], logits[sl])
        assert_masked(w, ids, rw[sl], rids[sl], outer[sl])
        res.append({"slice": [sl.start, sl.stop], "padded": int(outer[sl].sum())})
    EVIDENCE["dbo"] = {"micro_batches": res, "ok": True,
                       "fake": "UBatchWrapper via object.__new__ (no CUDA streams/SM control)"}
