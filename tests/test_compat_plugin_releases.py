"""``compat --plugin-src`` against the OFFICIAL vLLM release sources (read, never imported).

The fixture plugin (tests/fixtures/plugin_shapes/release_plugin, written for this test) holds the
shapes of vllm-gaudi's 0.31 fixes: a router factory copied without ``skip_padding``, a LoRA
wrapper predating a new abstract method, an assignment to ``Executor.is_sleeping`` (a plain
attribute in 0.30, a read-only property in 0.31) and an offloading worker ``__init__`` installed
by assignment with a signature older than 0.30's callers.  The breaking sets are exact per release,
so each check is shown to appear exactly when upstream changed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_padplugin.cli.compat import run_compat

PLUGIN = Path(__file__).resolve().parent / "fixtures" / "plugin_shapes" / "release_plugin"

OFFLOAD = ("override-missing-param", "vllm.v1.kv_offload.cpu.gpu_worker.CPUOffloadingWorker.__init__")
SINCE_031 = {
    ("abstract-method-missing", "vllm.lora.punica_wrapper.punica_base.PunicaWrapperBase.apply_lora_full_linear"),
    ("override-missing-param", "vllm.model_executor.layers.fused_moe.router.router_factory.create_fused_moe_router"),
    ("readonly-property", "vllm.v1.executor.abstract.Executor.is_sleeping"),
}


@pytest.mark.parametrize("version,expected", [
    ("0.30.0", {OFFLOAD}),
    ("0.31.0", {OFFLOAD} | SINCE_031),
    ("0.32.0", {OFFLOAD} | SINCE_031),
])
def test_release_breaks_exact(releases_dir, version, expected):
    out, code = run_compat(vllm_src=releases_dir / version, plugin_src=PLUGIN, fmt="json")
    doc = json.loads(out)
    got = {(g["kind"], g["symbol"]) for g in doc["root_causes"] if g["severity"] == "breaking"}
    assert got == expected, json.dumps(doc["root_causes"], indent=1)
    assert code == 1 and doc["errors"] == []


def test_release_evidence_points_at_upstream_lines(releases_dir):
    out, _ = run_compat(vllm_src=releases_dir / "0.31.0", plugin_src=PLUGIN, fmt="json")
    by = {g["kind"] + ":" + g["symbol"].rsplit(".", 1)[-1]: g for g in json.loads(out)["root_causes"]}
    router = by["override-missing-param:create_fused_moe_router"]
    assert router["items"] == ["skip_padding"]
    assert router["upstream_sites"][0].startswith("vllm/model_executor/layers/fused_moe/layer.py:")
    assert by["readonly-property:is_sleeping"]["upstream_sites"][0].startswith("vllm/v1/executor/abstract.py:")
    assert sorted(by["override-missing-param:__init__"]["items"]) == ["blocks_per_chunk", "canonical_layout",
                                                                       "num_cpu_chunks"]
    for g in by.values():
        assert g["plugin_sites"] and g["fix"] and g["why"]
