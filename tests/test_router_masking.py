"""Router-level masking on the installed vLLM, with a real forward context.

Real: vLLM's GroupedTopKRouter (built through the real factory, reached through the
real ``fused_moe.layer`` binding site after our patch), vLLM's ``VllmConfig`` /
``ParallelConfig`` (DeepEP v2 + expert parallel + DP=2 forced through them; evaluated
with vLLM's own ``FusedMoEParallelConfig.use_deepep_v2_kernels``), and
``set_forward_context(..., is_padding=...)``.

Adapted because this machine is CPU-only:
- the factory module's ``current_platform`` is replaced by a proxy of the real CPU
  platform whose ``is_cpu()`` says False (otherwise vLLM >= 0.30 builds CPURouter for
  everything); routing itself runs vLLM's native torch path;
- the mode is forced to backport / native with ``PADPLUGIN_FORCE_MODE``
  (the CUDA decision is tested in test_plugin_load / platforms unit tests);
- the forward context is built with a default (DP=1) config: DP=2 would all-reduce.
Under vLLM 0.30 "native" cannot happen upstream; forcing it there shows that a
factory lacking ``skip_padding`` is still masked by us.
"""
from __future__ import annotations

import importlib
import logging

import pytest
import torch

from conftest import vllm_version_tuple

pytestmark = pytest.mark.vllm

E, G, TOPG, K, H = 16, 4, 2, 2, 8
PAD = [False, True, False, True, True, False, False]
T = len(PAD)


class NotCpuPlatform:
    """Proxy of the real platform whose is_cpu() is False (so the factory picks
    GroupedTopKRouter as on a GPU); everything else is the real CPU platform."""

    def __init__(self, real):
        self._real = real

    def is_cpu(self):
        return False

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.fixture
def env(plugin_sandbox, monkeypatch):
    """Install the router-factory patch in this process (restored afterwards)."""
    from vllm_padplugin.patches import router_factory as patch

    rf = importlib.import_module("vllm.model_executor.layers.fused_moe.router.router_factory")
    layer = importlib.import_module("vllm.model_executor.layers.fused_moe.layer")
    monkeypatch.setattr(rf, "current_platform", NotCpuPlatform(rf.current_platform))
    for k in ("VLLM_MOE_SKIP_PADDING", "PADPLUGIN_STRICT", "PADPLUGIN_REPORT_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PADPLUGIN_FORCE_MODE", "backport")
    upstream = rf.create_fused_moe_router
    patch.install(rf)
    return {"rf": rf, "layer": layer, "upstream": upstream, "state": plugin_sandbox, "mp": monkeypatch}


def deepep_v2_config():
    from vllm.config import ParallelConfig, VllmConfig

    return VllmConfig(parallel_config=ParallelConfig(
        enable_expert_parallel=True, data_parallel_size=2, all2all_backend="deepep_v2"))


def build(factory, config=None, **extra):
    """Build a DeepSeek-V3-style grouped router (sigmoid + correction bias) under ``config``."""
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(config or deepep_v2_config()):
        return factory(top_k=K, global_num_experts=E, use_grouped_topk=True, num_expert_group=G,
                       topk_group=TOPG, scoring_func="sigmoid", renormalize=True,
                       e_score_correction_bias=torch.linspace(-0.1, 0.1, E), **extra)


def inputs():
    g = torch.Generator().manual_seed(7)
    return torch.randn(T, H, generator=g), torch.randn(T, E, generator=g)


def route(router, is_padding=None, with_context=True, ctx_config=None):
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    h, logits = inputs()
    if not with_context:
        out = router.select_experts(h, logits)
    else:
        with set_forward_context(None, ctx_config or VllmConfig(), num_tokens=T, is_padding=is_padding):
            out = router.select_experts(h, logits)
    return out[0], out[1]


def reference(env):
    """Upstream's routes for the same inputs, no masking involved."""
    return route(build(env["upstream"], config=env.get("config")), with_context=False)


def assert_masked(env, w, ids, pad=PAD):
    assert_masked_rows_only(w, ids, *reference(env), pad)


def assert_masked_rows_only(w, ids, ref_w, ref_ids, pad=PAD):
    """Padded rows (-1, 0); every other row bit for bit the reference's."""
    for r, p in enumerate(pad[:T]):
        if p:
            assert torch.all(ids[r] == -1) and torch.all(w[r] == 0), f"row {r} not masked"
        else:
            assert torch.equal(w[r].view(torch.int32), ref_w[r].view(torch.int32)), f"row {r} weights changed"
            assert torch.equal(ids[r], ref_ids[r]), f"row {r} ids changed"


def assert_unmasked(env, w, ids):
    rw, rids = reference(env)
    assert torch.equal(w, rw) and torch.equal(ids, rids)


def mask(pad=PAD):
    return torch.tensor(pad)


def test_backport_masks_routers_of_old_layers(env):
    """0.28-0.30 layers never pass skip_padding: under DeepEP v2 it is requested for them."""
    router = build(env["layer"].create_fused_moe_router)  # no skip_padding kwarg
    assert type(router).__name__ == "GroupedTopKRouter"
    assert_masked(env, *route(router, mask()))
    assert env["state"].masked_routers == 1 and env["state"].factory_calls == 1


def test_longer_persistent_mask_is_sliced(env):
    router = build(env["layer"].create_fused_moe_router)
    assert_masked(env, *route(router, mask(PAD + [True, False, True])))


def test_native_mode_is_not_masked_twice(env):
    env["mp"].setenv("PADPLUGIN_FORCE_MODE", "native")
    from vllm_padplugin.routing import MASKED_ATTR

    router = build(env["layer"].create_fused_moe_router, skip_padding=True)
    w, ids = route(router, mask())
    assert_masked(env, w, ids)
    if vllm_version_tuple() >= (0, 31):  # upstream masks itself: our wrapper stays out
        assert router.skip_padding is True
        assert not getattr(router, MASKED_ATTR, False) and env["state"].masked_routers == 0
    else:  # the factory lacks skip_padding: we mask
        assert getattr(router, MASKED_ATTR) and env["state"].masked_routers == 1


def test_no_deepep_v2_no_masking(env):
    from vllm.config import VllmConfig

    router = build(env["layer"].create_fused_moe_router, config=VllmConfig())
    assert_unmasked(env, *route(router, mask()))
    assert env["state"].masked_routers == 0


def test_other_all2all_backend_no_masking(env):
    from vllm.config import ParallelConfig, VllmConfig

    cfg = VllmConfig(parallel_config=ParallelConfig(
        enable_expert_parallel=True, data_parallel_size=2, all2all_backend="allgather_reducescatter"))
    assert_unmasked(env, *route(build(env["layer"].create_fused_moe_router, config=cfg), mask()))


def test_explicit_skip_padding_false_is_respected(env):
    router = build(env["layer"].create_fused_moe_router, skip_padding=False)
    assert_unmasked(env, *route(router, mask()))


def test_env_off_no_masking(env):
    env["mp"].setenv("VLLM_MOE_SKIP_PADDING", "0")
    assert_unmasked(env, *route(build(env["layer"].create_fused_moe_router), mask()))


def test_env_garbage_one_warning_default_on(env, caplog):
    env["mp"].setenv("VLLM_MOE_SKIP_PADDING", "maybe")
    with caplog.at_level(logging.WARNING, logger="vllm_padplugin"):
        r1 = build(env["layer"].create_fused_moe_router)
        build(env["layer"].create_fused_moe_router)
    warnings = [r for r in caplog.records if "VLLM_MOE_SKIP_PADDING" in r.getMessage()]
    assert len(warnings) == 1 and "'maybe'" in warnings[0].getMessage()
    assert_masked(env, *route(r1, mask()))


def test_passthrough_leaves_router_untouched(env):
    env["mp"].setenv("PADPLUGIN_FORCE_MODE", "passthrough")
    router = build(env["layer"].create_fused_moe_router, skip_padding=True)
    assert "_compute_routing" not in vars(router)
    if vllm_version_tuple() < (0, 31):
        assert_unmasked(env, *route(router, mask()))


def test_non_grouped_router_not_masked(env):
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(deepep_v2_config()):
        router = env["layer"].create_fused_moe_router(top_k=K, global_num_experts=E, scoring_func="softmax")
    assert type(router).__name__ != "GroupedTopKRouter"
    assert "_compute_routing" not in vars(router)


def test_no_forward_context_or_no_mask_routes_unchanged(env):
    router = build(env["layer"].create_fused_moe_router)
    assert_unmasked(env, *route(router, with_context=False))
    assert_unmasked(env, *route(router, None))


def test_bad_mask_one_warning_and_upstream_routes(env, caplog):
    """Serve-safe default: a mask shorter than the batch routes like upstream + ONE warning."""
    router = build(env["layer"].create_fused_moe_router)
    with caplog.at_level(logging.WARNING, logger="vllm_padplugin"):
        w, ids = route(router, mask(PAD[:3]))
        route(router, mask(PAD[:3]))
    assert_unmasked(env, w, ids)
    msgs = [r.getMessage() for r in caplog.records if "padding mask unusable" in r.getMessage()]
    assert len(msgs) == 1 and "(3,)" in msgs[0] and f"{T} rows" in msgs[0]


def test_bad_mask_strict_raises(env):
    from vllm_padplugin.masking import PaddingMaskError

    env["mp"].setenv("PADPLUGIN_STRICT", "1")
    router = build(env["layer"].create_fused_moe_router)  # strict is read at build time
    with pytest.raises(PaddingMaskError, match="torch.bool"):
        route(router, torch.zeros(T, dtype=torch.int64))


def test_deepep_v2_rule_without_vllm_class(env, monkeypatch):
    """If FusedMoEParallelConfig changed shape, the rule as of 0.28-0.34 is used instead."""
    from vllm.config import VllmConfig

    from vllm_padplugin import routing

    assert routing.deepep_v2_active(deepep_v2_config()) is True
    monkeypatch.setattr(routing, "_class_of", lambda sym: None)
    assert routing.deepep_v2_active(deepep_v2_config()) is True
    assert routing.deepep_v2_active(VllmConfig()) is False


def test_masked_routing_traces_in_one_graph(env):
    """torch.compile may trace the router: the masking path (forward-context read + pure
    torch mask) must trace without a graph break (fullgraph=True; eager backend, so no
    compiler is needed) and give the same result as eager."""
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    router = build(env["layer"].create_fused_moe_router)
    h, logits = inputs()

    def fn(h, logits):
        return router._compute_routing(h, logits, None)

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    with set_forward_context(None, VllmConfig(), num_tokens=T, is_padding=mask()):
        got, want = compiled(h, logits), fn(h, logits)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.all(got[1][torch.tensor(PAD)] == -1)
