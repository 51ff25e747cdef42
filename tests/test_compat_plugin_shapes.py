"""``compat --plugin-src`` on the code shapes real plugins use (issue 13).

Each fixture plugin under tests/fixtures/plugin_shapes/plugins/<shape>/ holds ONE shape and
is checked against the small fake vLLM in tests/fixtures/plugin_shapes/vllm_tree (both written
for these tests; no upstream code).  The expected BREAKING set is exact, so a test fails when a
shape is no longer found (recall) and when a non-breaking shape turns breaking (precision).
Checks run in-process through ``run_compat`` (the CLI's function); no mocks.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_padplugin.cli.compat import run_compat

FX = Path(__file__).resolve().parent / "fixtures" / "plugin_shapes"
TREE = FX / "vllm_tree"

# shape -> exact set of breaking (kind, symbol, item) and a subset of expected info (kind, symbol)
SHAPES = {
    "override_module_func": ({("override-missing-param", "vllm.router.make_router", "skip_padding")},
                             {("new-binding-site", "vllm.layer.make_router")}),
    "override_local_alias": ({("override-missing-param", "vllm.router.make_router", "skip_padding")}, set()),
    "override_kwargs_ok": (set(), {("new-binding-site", "vllm.layer.make_router")}),
    "override_init": ({("override-missing-param", "vllm.worker.Worker.__init__", "blocks_per_chunk")}, set()),
    "override_method": ({("override-missing-param", "vllm.worker.Worker.run", "fast")}, set()),
    "readonly_assign": ({("readonly-property", "vllm.executor.Executor.is_sleeping", "")}, set()),
    "abstract_missing": ({("abstract-method-missing", "vllm.base.Base.flush", "flush")},
                         {("abstract-method-missing", "vllm.base.Base.run")}),
    # vllm-gaudi's MultiModelEngineClient(EngineClient) before #1806 (release_kv_cache_memory)
    "abstract_async": ({("abstract-method-missing", "vllm.client.Client.release_memory", "release_memory")},
                       set()),
    "imports": ({("module-removed", "vllm.gone_mod", ""), ("symbol-moved", "vllm.old.helper", "")}, set()),
    "imports_guarded": (set(), {("module-removed", "vllm.gone_mod"), ("symbol-moved", "vllm.old.helper")}),
    "new_attribute": (set(), set()),
    "type_checking": ({("module-removed", "vllm.other_gone", "")}, set()),
    "call_removed_kwarg": ({("param-removed", "vllm.api.call_me", "c")}, set()),
}


def _run(shape: str, fmt: str = "json"):
    out, code = run_compat(vllm_src=TREE, plugin_src=FX / "plugins" / shape, fmt=fmt)
    return (json.loads(out) if fmt == "json" else out), code


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_severity_exact(shape):
    breaking, info = SHAPES[shape]
    doc, code = _run(shape)
    got = {(f["kind"], f["symbol"], f.get("item", "")) for f in doc["findings"] if f["severity"] == "breaking"}
    assert got == breaking, json.dumps(doc["findings"], indent=1)
    got_info = {(f["kind"], f["symbol"]) for f in doc["findings"] if f["severity"] == "info"}
    assert info <= got_info, json.dumps(doc["findings"], indent=1)
    assert code == (1 if breaking else 0) and doc["errors"] == []


@pytest.mark.parametrize("shape", sorted(s for s, (b, _) in SHAPES.items() if b))
def test_breaking_carries_evidence(shape):
    """plugin file:line, upstream file:line (or 'gone' for a removed module), why, fix."""
    doc, _ = _run(shape)
    for f in doc["findings"]:
        if f["severity"] != "breaking":
            continue
        assert f["plugin_site"].startswith("shape.py:") and int(f["plugin_site"].split(":")[1]) > 0, f
        if f["kind"] != "module-removed":
            path, line = f["upstream_site"].rsplit(":", 1)
            assert path.startswith("vllm/") and path.endswith(".py") and int(line) > 0, f
        assert f["why"] and f["fix"], f


def test_readonly_sites_are_one_root_cause():
    """Three assignments (instance, annotated parameter, receiver named after the class) are one
    root cause listing every site; the settable property and the unrelated receiver are not in it."""
    doc, _ = _run("readonly_assign")
    (f,) = [f for f in doc["findings"] if f["kind"] == "readonly-property"]
    assert sorted(f["plugin_sites"]) == ["shape.py:13", "shape.py:17", "shape.py:9"]
    (g,) = doc["root_causes"]
    assert g["severity"] == "breaking" and g["findings"] == 1


def test_removed_module_is_one_line():
    doc, _ = _run("imports")
    (f,) = [f for f in doc["findings"] if f["kind"] == "module-removed"]
    assert f["names"] == ["alpha", "beta", "gamma"] and f["symbol"] == "vllm.gone_mod"
    text, code = _run("imports", "text")
    assert code == 1
    assert [ln for ln in text.splitlines() if ln.startswith("[breaking] module-removed")] == [
        "[breaking] module-removed: vllm.gone_mod (alpha, beta, gamma)"]
    assert "2 breaking, 0 info (root causes; 2 findings)" in text


def test_text_sorted_breaking_first():
    text, _ = _run("abstract_missing", "text")
    heads = [ln.split("]")[0] + "]" for ln in text.splitlines() if ln.startswith("[")]
    assert heads == sorted(heads, key=lambda h: h != "[breaking]") and heads[0] == "[breaking]"


def test_markdown_is_fix_pr_body():
    md, code = _run("override_init", "md")
    assert code == 1
    assert md.startswith("## [FIX_FOR_VLLM_CUSTOM=9.9.9] Fix 1 vLLM API-drift break in ")
    assert "| # | Break | Symptom | Plugin site | Upstream |" in md
    assert "| 1 | override-missing-param: `Worker.__init__` (blocks_per_chunk) | TypeError | `shape.py:9` | " \
           "`vllm/spec.py:5` |" in md
    for section in ("## Bug 1:", "### Root cause", "### Culprit", "### Fix"):
        assert section in md


def test_markdown_lists_info_apart():
    md, code = _run("imports_guarded", "md")
    assert code == 0 and "Fix 0 vLLM API-drift breaks" in md and "## Bug" not in md
    assert "<details><summary>Not breaking (2 info)</summary>" in md


def test_abstract_coroutine_names_only_the_unfixed_adapter():
    """The adapter lacking the new abstract coroutine is reported at its class line; its subclass
    that adds the coroutine, and the abstract property implemented as a property, are not."""
    doc, _ = _run("abstract_async")
    (f,) = doc["findings"]
    assert f["detail"].startswith("Adapter derives from Client") and "FixedAdapter" not in f["detail"]
    assert f["plugin_site"] == "shape.py:8" and f["upstream_site"] == "vllm/client.py:17"


def test_definition_prefilter_skips_methods():
    """find_definitions' text prefilter: a name defined only as a method (``__init__`` in
    thousands of vLLM files) is not module level; module-level and conditional defs are."""
    import re

    from vllm_padplugin.compat.plugin_scan import _module_level_def

    rx = re.compile(rb"(?:async\s+def|def|class)\s+f\b")
    assert not _module_level_def(b"class A(\n    B,\n):\n    def f(self):\n        pass\n", rx)
    assert not _module_level_def(b"def outer():\n    # c\n    async def f():\n        pass\n", rx)
    assert not _module_level_def(b"x = 'def f'  # class f\n", rx)
    assert _module_level_def(b"import os\n\n\ndef f():\n    pass\n", rx)
    assert _module_level_def(b"try:\n    import a\nexcept ImportError:\n    def f():\n        pass\n", rx)
    assert _module_level_def(b"class A:\n    def f(self): ...\n\n\nif X:\n    class f:\n        pass\n", rx)
