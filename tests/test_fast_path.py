"""Fast-path selection on a CPU machine: which masking path, which fallback, one warning.

Real: the custom ops (``padplugin::mask_padded_routes_``, ``padplugin::fused_grouped_topk``),
torch.compile tracing them, and -- in the ``vllm`` tests -- vLLM's GroupedTopKRouter built
through the real factory with a real forward context (same set-up as test_router_masking).
The Triton kernels run through Triton's CPU interpreter (``TRITON_INTERPRET=1``).

Faked, because this machine has no CUDA: "the process serves on CUDA" (``_cuda_serving``)
and the one-time CUDA probe result; the GPU run of the same paths is
benchmarks/gpu_vllm_proof.py (tests/test_gpu_vllm_proof.py, marked ``gpu``).
"""
from __future__ import annotations

import logging

import pytest
import torch

from vllm_padplugin import routing, state
from vllm_padplugin.kernels import ops  # noqa: F401  (registers the ops)
from vllm_padplugin.kernels import triton_mask
from vllm_padplugin.masking import mask_padded_routes


@pytest.fixture
def clean(monkeypatch):
    for k in (routing.MASK_KERNEL_ENV, routing.FUSED_TOPK_ENV, "PADPLUGIN_STRICT", "TRITON_INTERPRET"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(state, "WARNED", set())
    monkeypatch.setattr(routing, "_PROBE", {})
    return monkeypatch


def warnings_of(caplog, text):
    return [r for r in caplog.records if text in r.getMessage()]


def test_not_cuda_uses_torch_silently(clean, caplog):
    with caplog.at_level(logging.WARNING, logger="vllm_padplugin"):
        assert routing.select_mask_impl(on_cuda=False) == "torch"
    assert not caplog.records


def test_cuda_without_triton_one_warning(clean, caplog):
    clean.setattr(triton_mask, "HAS_TRITON", False)
    with caplog.at_level(logging.WARNING, logger="vllm_padplugin"):
        assert routing.select_mask_impl(on_cuda=True) == "torch"
        assert routing.select_mask_impl(on_cuda=True) == "torch"
    assert len(warnings_of(caplog, "Triton is not importable")) == 1


def test_cuda_failing_probe_one_warning_strict_raises(clean, caplog):
    clean.setattr(routing, "_PROBE", {"cuda": "the Triton mask kernel failed (boom)"})
    with caplog.at_level(logging.WARNING, logger="vllm_padplugin"):
        assert routing.select_mask_impl(on_cuda=True) == "torch"
        assert routing.select_mask_impl(on_cuda=True) == "torch"
    assert len(warnings_of(caplog, "boom")) == 1
    clean.setenv("PADPLUGIN_STRICT", "1")
    with pytest.raises(RuntimeError, match="boom"):
        routing.select_mask_impl(on_cuda=True)


def test_cuda_passing_probe_uses_triton_unless_forced_torch(clean):
    clean.setattr(routing, "_PROBE", {"cuda": None})
    assert routing.select_mask_impl(on_cuda=True) == "triton"
    clean.setenv(routing.MASK_KERNEL_ENV, "torch")
    assert routing.select_mask_impl(on_cuda=True) == "torch"


def test_bad_kernel_env_one_warning_auto(clean, caplog):
    clean.setattr(routing, "_PROBE", {"cuda": None})
    clean.setenv(routing.MASK_KERNEL_ENV, "fastest")
    with caplog.at_level(logging.WARNING, logger="vllm_padplugin"):
        assert routing.select_mask_impl(on_cuda=True) == "triton"
        routing.select_mask_impl(on_cuda=True)
    assert len(warnings_of(caplog, "'fastest'")) == 1


def test_probe_catches_a_kernel_that_fails(clean):
    """The real probe, on CPU tensors with the launcher broken: reported, not raised."""
    def broken(*a, **k):
        raise RuntimeError("no driver")

    clean.setattr(triton_mask, "mask_padded_routes_inplace", broken)
    assert "no driver" in routing._probe_triton("cpu")
    assert routing._probe_triton("cpu") == routing._PROBE["cpu"]  # once per process


def _routes(t=37, k=8, extra=11, seed=3):
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(t, k, generator=g)
    ids = torch.randint(0, 256, (t, k), generator=g, dtype=torch.int32)
    pad = torch.rand(t + extra, generator=g) < 0.4
    return w, ids, pad


def test_mask_op_in_place_same_as_torch(clean):
    """use_triton on CPU tensors: the op falls back to torch in place; exact."""
    w, ids, pad = _routes()
    ew, eids = mask_padded_routes(w, ids, pad)
    wp, idp = w.data_ptr(), ids.data_ptr()
    torch.ops.padplugin.mask_padded_routes_(w, ids, pad, True)
    assert w.data_ptr() == wp and ids.data_ptr() == idp  # in place, no new tensors
    assert torch.equal(w.view(torch.int32), ew.view(torch.int32)) and torch.equal(ids, eids)


def test_mask_op_runs_the_triton_kernel_interpreted():
    """The op's Triton branch (kernel source in Triton's CPU interpreter, which must be on
    before triton is imported: a subprocess), bit-identical to torch, in place."""
    import os
    import subprocess
    import sys
    import textwrap

    pytest.importorskip("triton")
    code = textwrap.dedent('''
        import torch
        from vllm_padplugin.kernels import ops, triton_mask
        from vllm_padplugin.masking import mask_padded_routes
        calls = []
        real = triton_mask._mask_rows_kernel
        class Spy:
            def __getitem__(self, grid):
                calls.append(grid)
                return real[grid]
        triton_mask._mask_rows_kernel = Spy()
        g = torch.Generator().manual_seed(3)
        w = torch.rand(37, 8, generator=g); ids = torch.randint(0, 256, (37, 8), generator=g, dtype=torch.int32)
        pad = torch.rand(48, generator=g) < 0.4
        ew, eids = mask_padded_routes(w, ids, pad)
        torch.ops.padplugin.mask_padded_routes_(w, ids, pad, True)
        assert len(calls) == 1, calls
        assert torch.equal(w.view(torch.int32), ew.view(torch.int32)) and torch.equal(ids, eids)
        print("ok")
    ''')
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(__import__("pathlib").Path(__file__).parents[1]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_mask_op_traces_in_one_graph_without_recompiles(clean):
    """torch.compile (dynamic token dim) holds the op: one graph, no break, no recompile per size."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def step(w, ids, pad):
        w = w * 1.0
        ids = ids + 0
        torch.ops.padplugin.mask_padded_routes_(w, ids, pad, True)
        return w, ids

    cnt = CompileCounterWithBackend("aot_eager")
    fn = torch.compile(step, backend=cnt, fullgraph=True, dynamic=True)
    for t in (37, 64, 129):
        w, ids, pad = _routes(t=t)
        gw, gids = fn(w, ids, pad)
        ew, eids = mask_padded_routes(w, ids, pad)
        assert torch.equal(gw, ew) and torch.equal(gids, eids)
    assert cnt.frame_count == 1
    assert "padplugin.mask_padded_routes_" in str(cnt.graphs[0].code)


def test_fused_topk_opt_in_rules(clean, caplog):
    class R:
        scoring_func, num_fused_shared_experts, num_expert_group, topk_group = "sigmoid", 0, 8, 4

    assert not routing.fused_topk_wanted(R(), "triton")  # off by default
    clean.setenv(routing.FUSED_TOPK_ENV, "1")
    assert routing.fused_topk_wanted(R(), "triton")
    with caplog.at_level(logging.WARNING, logger="vllm_padplugin"):
        assert not routing.fused_topk_wanted(R(), "torch")
        assert not routing.fused_topk_wanted(R(), "torch")
    assert len(warnings_of(caplog, routing.FUSED_TOPK_ENV)) == 1
    softmax = R()
    softmax.scoring_func = "softmax"
    assert not routing.fused_topk_wanted(softmax, "triton")
    shared = R()
    shared.num_fused_shared_experts = 1
    assert not routing.fused_topk_wanted(shared, "triton")


def test_fused_op_traces_and_matches_reference(clean):
    from vllm_padplugin.kernels.reference import grouped_topk_reference

    g = torch.Generator().manual_seed(5)
    logits, bias = torch.randn(9, 64, generator=g), torch.randn(64, generator=g) * 0.1
    pad = torch.tensor([False, True] * 5)
    fn = torch.compile(lambda x, b, p: torch.ops.padplugin.fused_grouped_topk(x, b, p, 4, 8, 2, True, 2.5),
                       backend="aot_eager", fullgraph=True)
    w, ids = fn(logits, bias, pad)
    rw, rids = grouped_topk_reference(logits, bias, topk=4, num_expert_group=8, topk_group=2,
                                      routed_scaling_factor=2.5, is_padding=pad)
    assert torch.equal(ids, rids) and torch.allclose(w, rw)


# --- with real vLLM (router built through the real factory; see test_router_masking) ---------

from test_router_masking import PAD, E, K, G, TOPG, T, assert_masked, build, env, inputs, mask, route  # noqa: E402,F401


def _fake_cuda(mp):
    """Pretend the process serves on CUDA with a passing probe.  The tensors stay on CPU, so
    the ops take their torch branch: these tests check the wiring and the selection; the
    kernels themselves run in the subprocess test above and on the GPU (gpu_vllm_proof)."""
    mp.setattr(routing, "_cuda_serving", lambda: True)
    mp.setattr(routing, "_PROBE", {"cuda": None})
    mp.setattr(state, "WARNED", set())


@pytest.mark.vllm
def test_backport_router_uses_triton_path(env):
    _fake_cuda(env["mp"])
    router = build(env["layer"].create_fused_moe_router)
    assert getattr(router, routing.IMPL_ATTR) == "triton"
    assert getattr(router, routing.FUSED_ATTR) is False
    assert_masked(env, *route(router, mask()))


@pytest.mark.vllm
def test_backport_router_torch_fallback_same_result(env, caplog):
    _fake_cuda(env["mp"])
    env["mp"].setattr(triton_mask, "HAS_TRITON", False)
    with caplog.at_level(logging.WARNING, logger="vllm_padplugin"):
        r1 = build(env["layer"].create_fused_moe_router)
        build(env["layer"].create_fused_moe_router)
    assert getattr(r1, routing.IMPL_ATTR) == "torch"
    assert len(warnings_of(caplog, "Triton is not importable")) == 1
    assert_masked(env, *route(r1, mask()))


@pytest.mark.vllm
def test_backport_fused_topk_same_experts(env):
    """PADPLUGIN_FUSED_TOPK=1: same expert sets as upstream, weights within 1e-6 relative."""
    _fake_cuda(env["mp"])
    env["mp"].setenv(routing.FUSED_TOPK_ENV, "1")
    router = build(env["layer"].create_fused_moe_router)
    assert getattr(router, routing.FUSED_ATTR) is True
    w, ids = route(router, mask())
    ref = build(env["upstream"])
    rw, rids = route(ref, with_context=False)
    for r, p in enumerate(PAD):
        if p:
            assert torch.all(ids[r] == -1) and torch.all(w[r] == 0)
            continue
        assert set(ids[r].tolist()) == set(rids[r].tolist()), f"row {r} experts differ"
        order = torch.argsort(ids[r])
        rorder = torch.argsort(rids[r])
        torch.testing.assert_close(w[r][order], rw[r][rorder], rtol=1e-6, atol=1e-7)


@pytest.mark.vllm
def test_fused_topk_leaves_16bit_logits_to_upstream(env):
    """PADPLUGIN_FUSED_TOPK=1 with bf16 router logits: upstream's grouped top-k routes them,
    padded rows masked, every other row bit for bit upstream's.  The fused kernel computes a
    16-bit logit's sigmoid in fp32, upstream in the logits' dtype: its weights would differ by
    up to 0.5 % (benchmarks/logits16_semantics.py), where the opt-in promises 1e-6.  (vLLM
    0.32's DeepSeek-V2/V3 gate returns the weight's dtype unless the config sets
    ``moe_router_dtype: float32``.)"""
    from test_router_masking import assert_masked_rows_only
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    _fake_cuda(env["mp"])
    env["mp"].setenv(routing.FUSED_TOPK_ENV, "1")
    router = build(env["layer"].create_fused_moe_router)
    assert getattr(router, routing.FUSED_ATTR) is True      # served for fp32 logits
    h, logits = inputs()
    logits = logits.to(torch.bfloat16)
    with set_forward_context(None, VllmConfig(), num_tokens=T, is_padding=mask()):
        w, ids = router.select_experts(h, logits)[:2]
    rw, rids = build(env["upstream"]).select_experts(h, logits)[:2]
    assert_masked_rows_only(w, ids, rw, rids)


@pytest.mark.vllm
@pytest.mark.compat
def test_16bit_logits_are_routed_in_their_dtype_upstream():
    """Why the rule above exists, on the installed vLLM: its grouped_topk (its torch path,
    compiled as vLLM compiles it) on 16-bit logits gives weights more than 1e-4 relative away
    from fp32 arithmetic (the fused kernel's), on fp32 logits within 1e-6.  Fails once upstream
    computes 16-bit logits in fp32: then the fused kernel may serve them too."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from gpu_masking import ROUTERS
    from logits16_semantics import compare

    r32 = compare(256, ROUTERS["deepseek-v3"], torch.float32, 0)
    r16 = compare(256, ROUTERS["deepseek-v3"], torch.bfloat16, 0)
    assert r32["rows_other_set"] == 0 and r32["max_rel_weight_diff"] < 1e-6, r32
    assert r16["max_rel_weight_diff"] > 1e-4, r16


@pytest.mark.vllm
def test_native_fast_mask_swaps_upstream_masking(env):
    """0.31+: with the patch on, upstream's masked_fill is off and ours masks once, bit-identical."""
    from conftest import vllm_version_tuple

    if vllm_version_tuple() < (0, 31):
        pytest.skip("upstream masks natively only from 0.31")
    _fake_cuda(env["mp"])
    env["mp"].setenv("PADPLUGIN_FORCE_MODE", "native")
    env["mp"].setitem(routing.NATIVE_FAST_MASK, "on", True)
    ours = build(env["layer"].create_fused_moe_router, skip_padding=True)
    assert ours.skip_padding is False and getattr(ours, routing.IMPL_ATTR) == "triton"
    upstream = build(env["upstream"], skip_padding=True)
    w, ids = route(ours, mask())
    uw, uids = route(upstream, mask())
    assert torch.equal(w.view(torch.int32), uw.view(torch.int32)) and torch.equal(ids, uids)
    env["mp"].setitem(routing.NATIVE_FAST_MASK, "on", False)
    kept = build(env["layer"].create_fused_moe_router, skip_padding=True)
    assert kept.skip_padding is True and not getattr(kept, routing.MASKED_ATTR, False)
