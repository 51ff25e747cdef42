"""Static drift classes: each fixture overlay of the fake vLLM must be detected with the right
kind and severity (these fail if detection regresses); the clean fixtures report nothing.

The fake vLLM tree and the fixture plugins under tests/fixtures/compat are written for these
tests (no upstream code).  Checks run through ``run_compat`` (the CLI's function) in-process;
test_compat_cli.py covers the CLI as a subprocess.
"""
from __future__ import annotations

import json

import pytest

from compat_helpers import FX, PLUGINS, make_tree
from vllm_padplugin.cli.compat import run_compat

# (overlay, plugin fixture or None = our own registry, kind, severity, symbol suffix, item)
CASES = [
    ("", "gaudi_like", "override-missing-param", "breaking", "create_fused_moe_router", "skip_padding"),
    ("caller_new_kwarg", "copied_factory", "override-missing-param", "breaking", "create_fused_moe_router",
     "routing_bias"),
    ("param_removed", None, "param-removed", "breaking", "create_forward_context", "is_padding"),
    ("param_removed", "clean", "param-removed", "breaking", "create_forward_context", "is_padding"),
    ("param_required", "clean", "param-made-required", "breaking", "create_forward_context", "num_tokens"),
    # a verified move of OUR registry's symbol is followed (info); another plugin still breaks
    ("symbol_moved", None, "symbol-moved", "info", "router.router_factory", None),
    ("symbol_moved", "clean", "symbol-moved", "breaking", "create_fused_moe_router", None),
    ("lazy_shim", None, "symbol-moved", "info", "fused_moe.layer", None),
    ("lazy_shim", "clean", "module-lazy-shim", "breaking", "layer.create_fused_moe_router", None),
    ("new_binding_site", None, "new-binding-site", "info", "new_site.create_fused_moe_router",
     "vllm.models.demo.new_site"),
    ("new_binding_site", "fixed_rebind", "new-binding-site", "breaking", "new_site.create_fused_moe_router",
     "vllm.models.demo.new_site"),
    ("abstract_missing", "clean", "abstract-method-missing", "breaking", "BaseRouter.routing_method_type",
     "routing_method_type"),
    ("readonly_property", "clean", "readonly-property", "breaking", "FusedMoEParallelConfig.label", None),
    ("propagation_lost", None, "propagation-lost", "breaking", "UBatchRunner._make_forward_contexts",
     "is_padding"),
    ("propagation_lost_legacy", None, "propagation-lost", "breaking", "UBatchWrapper._make_ubatch_metadata",
     "is_padding"),
    ("env_removed", None, "env-removed", "breaking", "VLLM_MOE_SKIP_PADDING", None),
    ("env_removed", "clean", "env-removed", "breaking", "VLLM_MOE_SKIP_PADDING", None),
    ("env_default", None, "env-default-changed", "breaking", "VLLM_MOE_SKIP_PADDING", None),
    ("env_default", "clean", "env-default-changed", "breaking", "VLLM_MOE_SKIP_PADDING", None),
]


def _run(tree, plugin):
    out, code = run_compat(vllm_src=tree, plugin_src=PLUGINS / plugin if plugin else None, fmt="json")
    return code, json.loads(out)


@pytest.mark.parametrize("overlay,plugin,kind,severity,suffix,item", CASES,
                         ids=[f"{c[0] or 'base'}-{c[1] or 'ours'}-{c[2]}" for c in CASES])
def test_drift_class_detected(tmp_path, overlay, plugin, kind, severity, suffix, item):
    tree = make_tree(tmp_path, *([overlay] if overlay else []))
    code, doc = _run(tree, plugin)
    hits = [f for f in doc["findings"] if f["kind"] == kind and f["symbol"].endswith(suffix)]
    assert hits, f"{kind} on *{suffix} not found in {json.dumps(doc['findings'], indent=1)}"
    assert {f["severity"] for f in hits} == {severity}
    if item is not None:
        assert any(f.get("item") == item for f in hits), hits
    assert all(f["detail"] and f["fix"] for f in hits)
    expect_code = 1 if any(f["severity"] == "breaking" for f in doc["findings"]) else 0
    assert code == expect_code and doc["compatible"] == (expect_code == 0)


@pytest.mark.parametrize("plugin", [None, "clean", "copied_factory", "fixed_rebind"])
def test_clean_fixture_reports_nothing(tmp_path, plugin):
    code, doc = _run(FX / "vllm_base", plugin)
    assert doc["findings"] == [] and code == 0 and doc["compatible"] is True


def test_moved_symbol_names_its_new_home(tmp_path):
    code, doc = _run(make_tree(tmp_path, "symbol_moved"), None)
    moved = [f for f in doc["findings"] if f["kind"] == "symbol-moved"]
    assert moved[0]["moved_to"] == ["vllm.model_executor.layers.fused_moe.router.factory"]


def test_markdown_is_a_pr_section(tmp_path):
    out, code = run_compat(vllm_src=make_tree(tmp_path, "env_default"), fmt="md")
    assert code == 1
    assert "### [breaking] env-default-changed: `vllm.envs.VLLM_MOE_SKIP_PADDING`" in out
    assert "**Root cause:**" in out and "**Suggested fix:**" in out


def test_syntax_error_reported_other_checks_go_on(tmp_path):
    """Decision: a file that does not parse is an input error (exit 2) but every other check
    still runs and is reported; the broken module is not misreported as 'removed'."""
    tree = make_tree(tmp_path, "syntax_error", "propagation_lost")
    code, doc = _run(tree, None)
    assert code == 2
    assert any("vllm/envs.py:5" in e for e in doc["errors"])
    assert {f["kind"] for f in doc["findings"]} == {"propagation-lost"}


# -- our plugin against the official releases (sources read, never imported) ------------

def _release(releases_dir, v):
    out, code = run_compat(vllm_src=releases_dir / v, fmt="json")
    return code, json.loads(out)


def test_releases_without_skip_padding_are_info_not_breaking(releases_dir):
    for v in ("0.28.0", "0.29.0", "0.30.0"):
        code, doc = _release(releases_dir, v)
        assert code == 0 and doc["mode"] == "backport", (v, doc)
        assert ("param-removed", "info") in {(f["kind"], f["severity"]) for f in doc["findings"]}
        assert any(f["kind"] == "propagation-lost" and f["severity"] == "info" for f in doc["findings"]), v


def test_native_releases_are_clean_and_034_moves_are_info(releases_dir):
    for v in ("0.31.0", "0.32.0", "0.33.0"):
        code, doc = _release(releases_dir, v)
        assert (code, doc["mode"], doc["findings"]) == (0, "native", []), v
    code, doc = _release(releases_dir, "0.34.0")
    assert code == 0
    assert {(f["kind"], f["severity"], f["key"]) for f in doc["findings"]} == {
        ("symbol-moved", "info", "legacy_runner"), ("symbol-moved", "info", "dbo_mask_propagation_legacy")}


def test_function_params_helper_reads_without_import(releases_dir):
    from vllm_padplugin.compat.source import function_params

    mod = "vllm.model_executor.layers.fused_moe.router.router_factory"
    p30 = function_params(releases_dir / "0.30.0", mod, "create_fused_moe_router")
    p31 = function_params(releases_dir / "0.31.0" / "vllm", mod, "create_fused_moe_router")
    assert "skip_padding" not in [p.name for p in p30]
    assert [p.name for p in p31][-1] == "skip_padding" and p31[-1].default == "False"


def test_our_own_package_as_other_plugin_has_no_false_positive(releases_dir):
    """--plugin-src on this package: lazily provided names (vllm.platforms.current_platform via
    module __getattr__), try/except re-exports (vllm.__version__) and the plugin's own PADPLUGIN_*
    variables must not be reported as drift."""
    import vllm_padplugin

    pkg = vllm_padplugin.__path__[0]
    for v in ("0.30.0", "0.32.0"):
        out, code = run_compat(vllm_src=releases_dir / v, plugin_src=pkg, fmt="json")
        doc = json.loads(out)
        assert [f for f in doc["findings"] if f["severity"] == "breaking"] == [], (v, doc["findings"])


def test_same_named_factory_elsewhere_is_no_binding_site(tmp_path):
    """vLLM main has a second MoE path (``vllm/model_executor/hw_agnostic``) whose layer imports
    its OWN ``create_fused_moe_router``: not a binding site of the factory the plugin wraps (a
    rule by name alone reported it); a module importing ours through a package's re-export
    still is one, and so is that package."""
    code, doc = _run(make_tree(tmp_path, "second_moe_path", "reexport_site"), None)
    sites = {f["item"] for f in doc["findings"] if f["kind"] == "new-binding-site"}
    assert sites == {"vllm.model_executor.layers.fused_moe.router", "vllm.models.demo.via_package"}, doc
    assert code == 0 and doc["breaking"] == 0
