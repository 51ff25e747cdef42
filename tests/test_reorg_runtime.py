"""The REAL vLLM (this venv's CPU build) reorganised the way vLLM main is moving, at run time.

``tests/reorg_driver.py`` copies the installed vLLM package as a symlink farm, applies the
moves of ``reorg_tree.MAIN_MOVES`` (forward_context, envs, platforms, config, eplb_state;
every import rewritten, nothing left at the old paths unless a shim is asked for), and runs
it in a fresh interpreter:

- engine: the tiny DeepSeek-V3 generates greedily with the plugin loaded by vLLM itself and
  again with the plugin excluded (``VLLM_PLUGINS``): tokens identical; the plugin active,
  every MoE router built through our factory; zero breaking drift and ONE INFO line per move
  (no warning);
- router: masking through the real binding site on the reorganised tree (mode forced to
  backport; the factory module's platform is the FAKE ``NotCpuPlatform`` proxy of
  test_router_masking, since GroupedTopKRouter is only built off-CPU): padded rows masked,
  real rows identical to upstream's router; also with main's "sys.modules alias" shims;
- the MoE layer package moves too (factory AND binding site elsewhere), beside a second MoE
  path with its own same-named factory (vLLM main's ``hw_agnostic``): routers still built
  through our factory at the layer's new home, same tokens, masking correct;
- a symbol really removed (renamed everywhere) is still red: one warning naming it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "reorg_driver.py"
N_MOE_LAYERS = 2   # tiny DeepSeek-V3: 3 layers, the first dense
MOVES = {"vllm.forward_context", "vllm.envs", "vllm.platforms", "vllm.config"}


def _run(tmp: Path, what: str, *flags: str, tree: str, **env_over) -> dict:
    env = dict(os.environ)
    for k in ("VLLM_PLUGINS", "PADPLUGIN_STRICT", "PADPLUGIN_FORCE_MODE", "PADPLUGIN_REPORT_DIR",
              "VLLM_MOE_SKIP_PADDING", "REORG_ROOT"):
        env.pop(k, None)
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", VLLM_CACHE_ROOT=str(tmp / "vllm-cache"),
               REORG_TREE_DIR=str(tmp), REORG_ROOT=str(tmp / tree), PADPLUGIN_CACHE=str(tmp / "cache"),
               **env_over)
    proc = subprocess.run([sys.executable, str(DRIVER), what, *flags], env=env, capture_output=True,
                          text=True, timeout=500)
    res = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT="):
            res = json.loads(line[len("RESULT="):])
    assert res is not None, f"driver gave no result (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    res.update(rc=proc.returncode, stderr=proc.stderr)
    assert "error" not in res, res["error"] + "\n" + proc.stderr[-4000:]
    return res


@pytest.fixture(scope="module")
def runs(vllm, tmp_path_factory) -> dict:
    pytest.importorskip("transformers")
    from vllm_padplugin.tiny_model import build_tiny_model

    build_tiny_model()
    tmp = tmp_path_factory.mktemp("reorg-runtime")
    out = {}
    out["engine_on"] = _run(tmp, "engine", tree="plain")
    out["engine_off"] = _run(tmp, "engine", tree="plain", VLLM_PLUGINS="lora_filesystem_resolver")
    out["router"] = _run(tmp, "router", tree="plain", PADPLUGIN_FORCE_MODE="backport")
    out["router_alias"] = _run(tmp, "router", "--shim", "alias", tree="alias", PADPLUGIN_FORCE_MODE="backport")
    out["engine_fused_moe"] = _run(tmp, "engine", "--fused-moe", tree="fused_moe")
    out["router_fused_moe"] = _run(tmp, "router", "--fused-moe", tree="fused_moe", PADPLUGIN_FORCE_MODE="backport")
    out["router_removed"] = _run(tmp, "router", "--remove", "is_forward_context_available", tree="removed",
                                 PADPLUGIN_FORCE_MODE="backport")
    return out


def _drift(res) -> list[tuple[str, str, str]]:
    return [(d["kind"], d["severity"], d["symbol"]) for d in res["report"]["drift"]]


def _plugin_warnings(res) -> list[str]:
    return [ln for ln in res["log"] if ln.startswith(("WARNING", "ERROR"))]


def test_engine_runs_from_the_reorganised_tree(runs):
    res = runs["engine_on"]
    assert res["vllm_file"].startswith(res["root"])
    assert {m: res["old_paths_importable"][m] for m in MOVES} == {m: False for m in MOVES}   # really moved


def test_engine_plugin_active_one_info_per_move_no_warning(runs):
    res = runs["engine_on"]
    rep = res["report"]
    assert rep["factory_installed"] and rep["applied_patches"][:1] == ["router_factory"] and rep["errors"] == []
    assert rep["factory_calls"] == N_MOE_LAYERS and sum(rep["routers_built"].values()) == N_MOE_LAYERS
    assert all(sev == "info" for _, sev, _ in _drift(res)), _drift(res)
    assert {sym for kind, _, sym in _drift(res) if kind == "symbol-moved"} == MOVES
    infos = [ln for ln in res["log"] if ln.startswith("INFO") and "symbol-moved" in ln]
    assert len(infos) == len(MOVES)
    for old in MOVES:
        (line,) = [ln for ln in infos if f"symbol-moved: {old}:" in ln]
        assert "found " in line and f"(moved from {old};" in line
    assert _plugin_warnings(res) == []


def test_engine_tokens_identical_with_and_without_plugin(runs):
    on, off = runs["engine_on"], runs["engine_off"]
    assert off["report"]["factory_installed"] is False and off["report"]["factory_calls"] == 0
    assert on["generated_token_ids"] == off["generated_token_ids"]
    assert all(len(t) == 8 for t in on["generated_token_ids"])


@pytest.mark.parametrize("case", ["router", "router_alias", "router_fused_moe"])
def test_router_masking_correct_on_reorganised_tree(runs, case):
    res = runs[case]
    assert res["layer_factory_is_ours"] and res["router_class"] == "GroupedTopKRouter"
    assert res["padded_rows_masked"] and res["real_rows_equal_upstream"]
    assert res["report"]["mode"] == "backport" and res["report"]["masked_routers"] >= 1
    assert all(sev == "info" for _, sev, _ in _drift(res)) and _plugin_warnings(res) == []


def test_alias_shims_are_followed_to_the_defining_module(runs):
    res = runs["router_alias"]
    assert {m: res["old_paths_importable"][m] for m in MOVES} == {m: True for m in MOVES}
    moved = [d for d in res["report"]["drift"] if d["kind"] == "symbol-moved"]
    assert {d["symbol"] for d in moved} == MOVES and all(d["via"] == "shim" for d in moved)


def test_really_removed_symbol_is_red_one_warning(runs):
    res = runs["router_removed"]
    red = [d for d in res["report"]["drift"] if d["severity"] == "breaking"]
    assert [(d["kind"], d["key"]) for d in red] == [("symbol-removed", "is_forward_context_available")]
    (w,) = _plugin_warnings(res)
    assert "symbol-removed" in w and "is_forward_context_available" in w
    # the plugin falls back (catches the missing-context error) and still masks
    assert res["padded_rows_masked"] and res["real_rows_equal_upstream"]


def test_factory_and_layer_moved_too_binding_site_found(runs):
    """``fused_moe`` (router factory + layer.py) moved to vllm.runtime.modeling.layers: the
    plugin wraps the factory and rebinds the layer where they are now; same tokens."""
    res, off = runs["engine_fused_moe"], runs["engine_off"]
    rep = res["report"]
    assert res["old_paths_importable"]["vllm.model_executor.layers.fused_moe"] is False
    new = "vllm.runtime.modeling.layers.fused_moe"
    assert f"{new}.layer.create_fused_moe_router" in rep["binding_sites"], rep["binding_sites"]
    assert rep["factory_calls"] == N_MOE_LAYERS and rep["errors"] == []
    assert all(sev == "info" for _, sev, _ in _drift(res)) and _plugin_warnings(res) == []
    moved = {d["symbol"]: d["moved_to"] for d in rep["drift"] if d["kind"] == "symbol-moved"}
    assert moved["vllm.model_executor.layers.fused_moe.layer"] == [f"{new}.layer"]
    assert moved["vllm.model_executor.layers.fused_moe.router.router_factory"] == [f"{new}.router.router_factory"]
    # beside the second MoE path (its own same-named factory and layer.py): told apart by where
    # the package's other modules moved; its layer is no binding site of ours
    via = {d["symbol"]: d.get("via") for d in rep["drift"] if d["kind"] == "symbol-moved"}
    assert via["vllm.model_executor.layers.fused_moe.router.router_factory"] == "siblings"
    assert not any("hw_agnostic" in site for site in rep["binding_sites"])
    assert res["generated_token_ids"] == off["generated_token_ids"]
