"""The factory override on the installed vLLM: binding sites, idempotence, other plugins.

Real vLLM modules (router_factory, fused_moe.layer) are patched in this process by the
real patch and restored afterwards (``plugin_sandbox``).  The "other plugin" is a FAKE
of vllm-gaudi's factory replacement (a wrapper that calls upstream's factory without
``skip_padding``): vllm-gaudi cannot be installed here.  Routers are GroupedTopKRouter
as on a GPU (factory module's ``current_platform`` proxied, see test_router_masking).
"""
from __future__ import annotations

import importlib
import inspect
import sys
import textwrap

import pytest

from test_router_masking import NotCpuPlatform, assert_masked, build, mask, route

pytestmark = pytest.mark.vllm

RF = "vllm.model_executor.layers.fused_moe.router.router_factory"
LAYER = "vllm.model_executor.layers.fused_moe.layer"


@pytest.fixture
def env(plugin_sandbox, monkeypatch):
    rf = importlib.import_module(RF)
    layer = importlib.import_module(LAYER)
    monkeypatch.setattr(rf, "current_platform", NotCpuPlatform(rf.current_platform))
    for k in ("VLLM_MOE_SKIP_PADDING", "PADPLUGIN_STRICT", "PADPLUGIN_REPORT_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PADPLUGIN_FORCE_MODE", "backport")
    return {"rf": rf, "layer": layer, "upstream": rf.create_fused_moe_router, "state": plugin_sandbox,
            "mp": monkeypatch}


def make_fake_gaudi(target):
    """FAKE of vllm-gaudi's replacement factory: forwards to ``target`` but never passes
    skip_padding (it predates it), and does not use functools.wraps."""
    calls = []

    def hpu_create_fused_moe_router(*args, **kwargs):
        kwargs.pop("skip_padding", None)
        calls.append(kwargs)
        return target(*args, **kwargs)

    hpu_create_fused_moe_router.__module__ = "vllm_gaudi.fake_ops"
    hpu_create_fused_moe_router.__qualname__ = "hpu_create_fused_moe_router"
    return hpu_create_fused_moe_router, calls


def install(env):
    from vllm_padplugin.patches import router_factory as patch

    return patch.install(env["rf"])


def inner_of(f):
    return f.__padplugin_inner__


def test_install_rebinds_layer_and_factory_module(env):
    from vllm_padplugin.router_override import is_ours

    sites = install(env)
    assert f"{LAYER}.create_fused_moe_router" in sites and f"{RF}.create_fused_moe_router" in sites
    for mod in (env["rf"], env["layer"]):
        f = mod.create_fused_moe_router
        assert is_ours(f) and inner_of(f) is env["upstream"]
    sig = inspect.signature(env["layer"].create_fused_moe_router)
    assert "skip_padding" in sig.parameters and list(sig.parameters)[0] == "top_k"


def test_installing_twice_is_one_installation(env):
    install(env)
    first = env["layer"].create_fused_moe_router
    install(env)
    assert env["layer"].create_fused_moe_router is first and inner_of(first) is env["upstream"]
    build(env["layer"].create_fused_moe_router)
    assert env["state"].factory_calls == 1


def test_foreign_factory_before_us(env):
    gaudi, calls = make_fake_gaudi(env["upstream"])
    env["layer"].create_fused_moe_router = gaudi  # the other plugin loaded first
    install(env)
    ours = env["layer"].create_fused_moe_router
    assert inner_of(ours) is gaudi
    assert inspect.signature(ours) == inspect.signature(env["rf"].create_fused_moe_router), \
        "signature is upstream's (+skip_padding), not the foreign (*args, **kwargs)"
    router = build(ours, skip_padding=True)
    assert calls and "skip_padding" not in calls[-1]
    assert_masked(env, *route(router, mask()))
    assert env["state"].foreign_factories == ["vllm_gaudi.fake_ops.hpu_create_fused_moe_router"]


def test_foreign_factory_everywhere_before_us_keeps_upstream_signature(env):
    """Both sites hold the foreign (*args, **kwargs) factory: upstream's signature is found
    through the function it forwards to (closure), so parity still holds."""
    gaudi, calls = make_fake_gaudi(env["upstream"])
    env["layer"].create_fused_moe_router = gaudi
    env["rf"].create_fused_moe_router = gaudi
    install(env)
    for mod in (env["layer"], env["rf"]):
        ours = mod.create_fused_moe_router
        assert inner_of(ours) is gaudi
        up = inspect.signature(env["upstream"])
        assert list(inspect.signature(ours).parameters)[: len(up.parameters)] == list(up.parameters)
        assert "skip_padding" in inspect.signature(ours).parameters


@pytest.mark.parametrize("where", ["layer", "rf"])
def test_foreign_factory_after_us(env, where):
    """Assignment after us goes through the module guard: used there, wrapped by us."""
    from vllm_padplugin.router_override import is_ours

    install(env)
    before_layer = env["layer"].create_fused_moe_router
    gaudi, calls = make_fake_gaudi(env["upstream"])
    setattr(env[where], "create_fused_moe_router", gaudi)
    got = getattr(env[where], "create_fused_moe_router")
    assert is_ours(got) and inner_of(got) is gaudi
    if where == "rf":  # upstream semantics: layer keeps what it imported
        assert env["layer"].create_fused_moe_router is before_layer
    router = build(got, skip_padding=True)
    assert len(calls) == 1
    assert_masked(env, *route(router, mask()))


def test_foreign_wrapping_our_wrapper_counts_and_masks_once(env):
    """A plugin that captured OUR factory and wraps it again: the outer wrapper decides."""
    install(env)
    gaudi, calls = make_fake_gaudi(env["rf"].create_fused_moe_router)
    env["layer"].create_fused_moe_router = gaudi
    router = build(env["layer"].create_fused_moe_router, skip_padding=True)
    assert env["state"].factory_calls == 1 and env["state"].masked_routers == 1
    assert_masked(env, *route(router, mask()))


def test_binding_site_imported_after_install_is_covered(env, tmp_path, monkeypatch):
    """A binding site that a later vLLM adds (like models/step5/nvidia/mega_moe.py in 0.33)
    imported after we installed: it copies our wrapper; the report lists it; it is guarded."""
    import vllm

    from vllm_padplugin.report import build_report
    from vllm_padplugin.router_override import is_ours

    install(env)
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "padplugin_new_site.py").write_text(textwrap.dedent(f"""
        from {RF} import (
            create_fused_moe_router,
        )
    """))
    monkeypatch.setattr(vllm, "__path__", [*vllm.__path__, str(pkg)])
    monkeypatch.delitem(sys.modules, "vllm.padplugin_new_site", raising=False)
    site = importlib.import_module("vllm.padplugin_new_site")
    try:
        assert is_ours(site.create_fused_moe_router)
        assert "vllm.padplugin_new_site.create_fused_moe_router" in build_report()["binding_sites"]
        build(env["layer"].create_fused_moe_router)  # first build guards every holder
        gaudi, _ = make_fake_gaudi(env["upstream"])
        site.create_fused_moe_router = gaudi
        assert is_ours(site.create_fused_moe_router)
    finally:
        sys.modules.pop("vllm.padplugin_new_site", None)


def test_hook_exception_keeps_upstream_and_warns_once(env, caplog):
    """A failing patch (here: the factory module reports a broken attribute) gives ONE
    warning naming the cause, and vLLM's factory stays upstream's."""
    import logging

    from vllm_padplugin import state
    from vllm_padplugin.patches import apply_all
    from vllm_padplugin.patches.base import Env

    env["mp"].delattr(env["rf"], "create_fused_moe_router")
    with caplog.at_level(logging.WARNING, logger="vllm_padplugin"):
        apply_all(Env("x", "cpu", "backport", False), state.fail)
    msgs = [r.getMessage() for r in caplog.records if r.name == "vllm_padplugin"]
    assert len(msgs) == 1 and "AttributeError" in msgs[0] and "router_factory" in msgs[0]
    assert "vLLM continues with upstream behaviour" in msgs[0]
    assert env["layer"].create_fused_moe_router is env["upstream"]
    with pytest.raises(RuntimeError, match="STRICT"):
        env["mp"].setenv("PADPLUGIN_STRICT", "1")
        apply_all(Env("x", "cpu", "backport", True), state.fail)
