"""HPU path with a FAKE HPU platform (vllm-gaudi cannot be installed here).

The fake is a proxy of the real CPU platform that reports ``device_type == "hpu"`` and
``is_cpu() == False``; it is installed as vLLM's resolved ``current_platform`` and in
the factory module, so the mode decision (platforms.py) and the factory take the HPU
branch.  Everything else is real: vLLM's factory and GroupedTopKRouter, DeepEP v2 forced
through vLLM's config objects, a real forward context carrying ``is_padding``.
Expected: ``skip_padding=True`` is accepted and the routes are exactly upstream's.
"""
from __future__ import annotations

import importlib

import pytest

from test_router_masking import NotCpuPlatform, assert_unmasked, build, mask, route

pytestmark = pytest.mark.vllm


class FakeHpuPlatform(NotCpuPlatform):
    """FAKE vllm-gaudi platform: device_type "hpu", not CPU; the rest is the real platform."""

    device_type = "hpu"


@pytest.fixture
def env(plugin_sandbox, monkeypatch):
    import vllm.platforms as platforms

    from vllm.config import VllmConfig

    from vllm_padplugin.patches import router_factory as patch
    from test_router_masking import deepep_v2_config

    # vLLM's config validation consults the platform: configs are built before the fake.
    config, ctx_config = deepep_v2_config(), VllmConfig()
    rf = importlib.import_module("vllm.model_executor.layers.fused_moe.router.router_factory")
    layer = importlib.import_module("vllm.model_executor.layers.fused_moe.layer")
    fake = FakeHpuPlatform(platforms.current_platform)
    monkeypatch.setattr(platforms, "_current_platform", fake)
    monkeypatch.setattr(rf, "current_platform", fake)
    for k in ("PADPLUGIN_FORCE_MODE", "VLLM_MOE_SKIP_PADDING", "PADPLUGIN_REPORT_DIR"):
        monkeypatch.delenv(k, raising=False)
    upstream = rf.create_fused_moe_router
    patch.install(rf)
    return {"rf": rf, "layer": layer, "upstream": upstream, "state": plugin_sandbox,
            "config": config, "ctx": ctx_config}


def test_hpu_mode_decided_from_platform(env):
    from vllm_padplugin.platforms import decide_mode

    assert decide_mode() == "hpu-noop"


def test_skip_padding_accepted_routes_unchanged(env):
    router = build(env["layer"].create_fused_moe_router, config=env["config"], skip_padding=True)
    assert type(router).__name__ == "GroupedTopKRouter"
    assert env["state"].mode == "hpu-noop"
    assert getattr(router, "skip_padding", False) is False, "not forwarded to upstream on HPU"
    assert "_compute_routing" not in vars(router) and env["state"].masked_routers == 0
    assert_unmasked(env, *route(router, mask(), ctx_config=env["ctx"]))


def test_foreign_hpu_factory_without_skip_padding(env):
    """A FAKE vllm-gaudi factory that predates skip_padding, assigned after us: the
    layer's call with skip_padding=True still works and changes nothing."""
    seen = []

    def hpu_create_fused_moe_router(**kwargs):
        seen.append(kwargs)
        return env["upstream"](**kwargs)

    hpu_create_fused_moe_router.__module__ = "vllm_gaudi.fake_ops"
    env["layer"].create_fused_moe_router = hpu_create_fused_moe_router
    router = build(env["layer"].create_fused_moe_router, config=env["config"], skip_padding=True)
    assert seen and "skip_padding" not in seen[0]
    assert_unmasked(env, *route(router, mask(), ctx_config=env["ctx"]))
