"""Fault injection on a real vLLM (CPU build): what a user sees when something goes wrong.

Every case runs ``tests/fault_driver.py`` in a fresh interpreter with the real vLLM of
this venv: the driver applies one fault to vLLM (monkeypatching upstream objects, or a
symlink copy of the installed vLLM package with edited source files for "upstream
changed" faults), then loads the plugin through vLLM's own loader
(``load_general_plugins``, or ``LLM(...)`` for the engine cases) and builds routers
through the real ``fused_moe.layer`` binding site.  The outcome asserted for each fault:
vLLM keeps serving with upstream behaviour and ONE warning line naming the cause, or,
with ``PADPLUGIN_STRICT=1``, a clear error at load.

Fakes, as the driver says: vllm-gaudi's factory replacement (not installable here) is a
fake; masking faults build GroupedTopKRouter through a proxy of the CPU platform whose
``is_cpu()`` is False (no GPU here), with the mode forced to backport and DeepEP v2 set
through vLLM's own config objects.  Engine cases (``slow``) start the tiny DeepSeek-V3
with V1 multiprocessing off (~15 s each); the rest stay at router level.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "fault_driver.py"
RF = "vllm.model_executor.layers.fused_moe.router.router_factory"
N_MOE_LAYERS = 2  # tiny DeepSeek-V3: 3 layers, first dense
PARALLEL = max(2, min(4, (os.cpu_count() or 2) + 1))

MASKING = {"PADPLUGIN_FORCE_MODE": "backport"}
STRICT = {"PADPLUGIN_STRICT": "1"}
DEV_VERSION = "0.35.0.dev12+gabc1234"

#: name -> (fault, driver flags, env)
ROUTER_CASES = {
    "baseline_masking": ("none", ["--masking"], MASKING),
    "sig_incompatible": ("sig_incompatible", [], {}),
    "factory_moved": ("factory_moved", [], {}),
    "factory_removed": ("factory_removed", [], {}),
    "no_is_padding": ("no_is_padding", ["--masking"], MASKING),
    "env_garbage": ("env_garbage", ["--masking"], MASKING),
    "foreign_before": ("foreign_before", ["--masking"], MASKING),
    "foreign_after": ("foreign_after", ["--masking"], MASKING),
    "loaded_twice": ("loaded_twice", [], {}),
    "dev_version": ("dev_version", [], {"FAULT_VLLM_VERSION": DEV_VERSION}),
    "unknown_version": ("dev_version", [], {"FAULT_VLLM_VERSION": "unknown"}),
    "excluded": ("none", [], {"VLLM_PLUGINS": "lora_filesystem_resolver"}),
    "strict_sig_incompatible": ("sig_incompatible", [], STRICT),
    "strict_factory_moved": ("factory_moved", [], STRICT),
    "strict_no_is_padding": ("no_is_padding", ["--masking"], {**MASKING, **STRICT}),
}
ENGINE_CASES = {
    "baseline": ("none", ["--engine"], {}),
    "sig_incompatible": ("sig_incompatible", ["--engine"], {}),
    "factory_moved": ("factory_moved", ["--engine"], {}),
    "foreign_after": ("foreign_after", ["--engine"], {}),
    "strict_sig_incompatible": ("sig_incompatible", ["--engine"], STRICT),
}


def _env(tmp: Path, over: dict) -> dict:
    env = dict(os.environ)
    for k in ("VLLM_PLUGINS", "PADPLUGIN_STRICT", "PADPLUGIN_FORCE_MODE", "PADPLUGIN_REPORT_DIR",
              "VLLM_MOE_SKIP_PADDING", "VLLM_ENABLE_V1_MULTIPROCESSING", "FAULT_VLLM_VERSION"):
        env.pop(k, None)
    env.update(VLLM_TARGET_DEVICE="cpu", FAULT_TREE_DIR=str(tmp), HF_HUB_OFFLINE="1",
               VLLM_CACHE_ROOT=str(tmp / "vllm-cache"), **over)
    return env


def _run(tmp: Path, fault: str, flags: list[str], over: dict) -> dict:
    proc = subprocess.run([sys.executable, str(DRIVER), fault, *flags], env=_env(tmp, over),
                          capture_output=True, text=True, timeout=400)
    res = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT="):
            res = json.loads(line[len("RESULT="):])
    assert res is not None, f"driver gave no result (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    res.update(rc=proc.returncode, stderr=proc.stderr)
    return res


def _run_all(tmp: Path, cases: dict) -> dict:
    with ThreadPoolExecutor(PARALLEL) as pool:
        futs = {name: pool.submit(_run, tmp, *case) for name, case in cases.items()}
        return {name: f.result() for name, f in futs.items()}


@pytest.fixture(scope="module")
def runs(vllm, tmp_path_factory) -> dict:
    return _run_all(tmp_path_factory.mktemp("faults"), ROUTER_CASES)


@pytest.fixture(scope="module")
def engine_runs(vllm, tmp_path_factory) -> dict:
    pytest.importorskip("transformers")
    from vllm_padplugin.tiny_model import build_tiny_model

    build_tiny_model()  # once, before the engines start in parallel
    return _run_all(tmp_path_factory.mktemp("engine-faults"), ENGINE_CASES)


def plugin_warnings(res: dict) -> list[str]:
    """The plugin's warning lines as the user sees them on stderr (its logger has no
    handler of its own: Python prints WARNING and above, message only)."""
    return [ln for ln in res["stderr"].splitlines()
            if ln.startswith("vllm_padplugin:") or ln.startswith("vLLM drift [breaking]")]


def serves_like_upstream(res: dict) -> None:
    assert res["rc"] == 0 and "error" not in res, res.get("error") or res["stderr"][-3000:]
    assert res["routes_equal_upstream"] and res["no_context_routes_equal_upstream"]


# --------------------------------------------------------------------------- router level
def test_baseline_masks_and_is_silent(runs):
    """No fault (reference for the masking cases): padded rows masked, real rows
    bit-identical; no forward context at call time (profiling, dummy runs) routes
    exactly like upstream, without a warning (a normal vLLM state, not a fault)."""
    res = runs["baseline_masking"]
    assert res["rc"] == 0 and res["router_class"] == "GroupedTopKRouter"
    assert res["padded_rows_masked"] and res["real_rows_equal_upstream"]
    assert res["no_context_routes_equal_upstream"]
    assert plugin_warnings(res) == [] and res["report"]["masked_routers"] >= 1


def test_incompatible_factory_signature_one_warning_router_still_routes(runs):
    """Upstream renamed the factory's ``use_grouped_topk`` (source edit): one drift line
    names the parameter; our wrapper takes the NEW signature and routes like upstream."""
    res = runs["sig_incompatible"]
    serves_like_upstream(res)
    (w,) = plugin_warnings(res)
    assert "param-removed" in w and "'use_grouped_topk'" in w and "create_fused_moe_router" in w
    assert res["layer_factory_is_ours"] and res["report"]["errors"] == []


def test_factory_moved_is_followed_one_info_no_warning(runs):
    """router_factory.py moved to router_factory_v2.py (same function, same parameters): the
    plugin finds it there (issue 12: static search, nothing imported to look), wraps it and the
    layer's binding, and says so ONCE at INFO (not a warning); routes like upstream."""
    res = runs["factory_moved"]
    serves_like_upstream(res)
    assert plugin_warnings(res) == []
    assert res["layer_factory_is_ours"] and res["report"]["factory_installed"] is True
    assert res["report"]["errors"] == []
    (mv,) = [d for d in res["report"]["drift"] if d["kind"] == "symbol-moved"]
    assert mv["severity"] == "info" and mv["moved_to"] == [
        "vllm.model_executor.layers.fused_moe.router.router_factory_v2"]


def test_strict_mode_accepts_a_followed_move(runs):
    """PADPLUGIN_STRICT=1 stops on breaking drift only: a move the plugin follows is info."""
    res = runs["strict_factory_moved"]
    assert res["rc"] == 0 and "error" not in res, res.get("error")
    assert res["layer_factory_is_ours"] and res["report"]["factory_installed"] is True


def test_factory_removed_one_warning_upstream_router_used(runs):
    """create_fused_moe_router no longer exists (layer.py builds through ``build_router``):
    ONE line names the removed symbol; upstream's function builds the routers."""
    res = runs["factory_removed"]
    serves_like_upstream(res)
    (w,) = plugin_warnings(res)
    assert "symbol-removed" in w and "create_fused_moe_router" in w
    assert not res["layer_factory_is_ours"] and res["report"]["errors"]


def test_forward_context_without_is_padding_warns_per_drifted_symbol_and_routes_unmasked(runs):
    """A vLLM whose forward-context API has no ``is_padding`` (field and both builders'
    parameter removed in the source): one line per drifted symbol, each naming
    is_padding, nothing else; routers route exactly like upstream (nothing to mask by)."""
    res = runs["no_is_padding"]
    serves_like_upstream(res)
    ws = plugin_warnings(res)
    assert len(ws) == 3 and all("is_padding" in w for w in ws), ws
    assert {w.split(": ")[1] for w in ws} == {"vllm.forward_context.ForwardContext.is_padding",
                                               "vllm.forward_context.create_forward_context",
                                               "vllm.forward_context.set_forward_context"}


def test_skip_padding_env_garbage_one_warning_default_on(runs):
    res = runs["env_garbage"]
    assert res["rc"] == 0
    (w,) = plugin_warnings(res)
    assert "VLLM_MOE_SKIP_PADDING='maybe'" in w and "default" in w
    assert res["padded_rows_masked"] and res["real_rows_equal_upstream"]


@pytest.mark.parametrize("case", ["foreign_before", "foreign_after"])
def test_other_plugin_replaced_factory(runs, case):
    """FAKE vllm-gaudi factory (forwards without skip_padding, no functools.wraps) assigned
    to the layer's binding site before / after our load: it builds every router, we wrap
    it, it still masks; the report names it.  Supported, so no warning."""
    res = runs[case]
    assert res["rc"] == 0 and res["layer_factory_is_ours"]
    assert res["foreign_calls"] >= 1
    assert res["padded_rows_masked"] and res["real_rows_equal_upstream"]
    assert res["report"]["foreign_factories"] == ["vllm_gaudi.fake_ops.hpu_create_fused_moe_router"]
    assert plugin_warnings(res) == []


def test_loaded_twice_is_one_installation(runs):
    """vLLM's loader run twice plus both hooks called by hand: one wrapper, silent."""
    res = runs["loaded_twice"]
    serves_like_upstream(res)
    assert res["layer_factory_is_ours"] and plugin_warnings(res) == []
    assert res["report"]["errors"] == [] and res["report"]["applied_patches"] == ["router_factory"]


@pytest.mark.parametrize("case,version", [("dev_version", DEV_VERSION), ("unknown_version", "unknown")])
def test_unknown_vllm_version_string(runs, case, version):
    """Capabilities are detected, never parsed from the version: a dev or unknown
    ``vllm.__version__`` changes nothing but the report."""
    res = runs[case]
    serves_like_upstream(res)
    assert res["layer_factory_is_ours"] and plugin_warnings(res) == []
    assert res["report"]["vllm_version"] == version and res["report"]["errors"] == []


def test_vllm_plugins_excluding_us(runs):
    res = runs["excluded"]
    serves_like_upstream(res)
    assert not res["layer_factory_is_ours"] and res["report"]["loaded"] is False
    assert res["report"]["entry_points_found"] and not res["report"]["entry_points_allowed"]
    assert plugin_warnings(res) == []


def test_report_cli_says_vllm_plugins_excludes_us(vllm, tmp_path):
    env = _env(tmp_path, {"VLLM_PLUGINS": "lora_filesystem_resolver"})
    proc = subprocess.run([sys.executable, "-m", "vllm_padplugin.cli", "report"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "EXCLUDED by VLLM_PLUGINS" in proc.stdout and "loaded:         False" in proc.stdout


@pytest.mark.parametrize("case,needle", [("strict_sig_incompatible", "'use_grouped_topk'"),
                                         ("strict_no_is_padding", "is_padding")])
def test_strict_mode_turns_drift_into_one_error_at_load(runs, case, needle):
    """PADPLUGIN_STRICT=1: ``load_general_plugins()`` raises one RuntimeError naming
    the drift (not re-wrapped by the outer hooks), before any router is built."""
    res = runs[case]
    assert res["rc"] == 3 and res["error"].startswith("RuntimeError: vllm_padplugin: drift check failed")
    assert needle in res["error"] and res["error"].count("[PADPLUGIN_STRICT=1]") == 1
    assert res["report"]["factory_calls"] == 0 and "router_class" not in res


def test_report_without_vllm_installed_exit_2(vllm, tmp_path):
    """A Python where vLLM is NOT installed: a sys.path holding this venv's packages
    except vllm (symlinks), started with -S -I so site-packages is never added."""
    sp = Path(vllm.__file__).resolve().parent.parent
    pkgs = tmp_path / "site"
    pkgs.mkdir()
    for entry in sp.iterdir():
        if not entry.name.lower().startswith("vllm") and not entry.name.endswith(".pth"):
            (pkgs / entry.name).symlink_to(entry)
    code = (f"import sys; sys.path[:0] = [{str(pkgs)!r}, {str(HERE.parent)!r}]\n"
            "import importlib.util; assert importlib.util.find_spec('vllm') is None\n"
            "sys.argv = ['vllm-padplugin', 'report']\n"
            "from vllm_padplugin.cli import main; main()")
    proc = subprocess.run([sys.executable, "-S", "-I", "-B", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "vLLM is not installed" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout


# --------------------------------------------------------------------------- engine level
@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("case", ["sig_incompatible", "factory_moved", "foreign_after"])
def test_engine_keeps_serving_same_tokens(engine_runs, case):
    """LLM(...) + generate under the fault: same greedy tokens as without it."""
    base, res = engine_runs["baseline"], engine_runs[case]
    assert base["rc"] == 0 and res["rc"] == 0, (base.get("error"), res.get("error"), res["stderr"][-3000:])
    assert len(base["generated_token_ids"]) == 8
    assert res["generated_token_ids"] == base["generated_token_ids"]
    assert plugin_warnings(base) == []
    ws = plugin_warnings(res)
    rep = res["report"]
    if case == "sig_incompatible":
        assert len(ws) == 1 and "'use_grouped_topk'" in ws[0]
        assert rep["factory_calls"] == N_MOE_LAYERS  # our wrapper built every MoE router
    elif case == "factory_moved":   # followed (issue 12): our wrapper built every MoE router
        assert ws == [] and rep["factory_calls"] == N_MOE_LAYERS
    else:
        assert ws == [] and res["foreign_calls"] == N_MOE_LAYERS and rep["factory_calls"] == N_MOE_LAYERS
        assert rep["foreign_factories"] == ["vllm_gaudi.fake_ops.hpu_create_fused_moe_router"]


@pytest.mark.slow
@pytest.mark.e2e
def test_engine_strict_mode_refuses_to_start(engine_runs):
    res = engine_runs["strict_sig_incompatible"]
    assert res["rc"] == 3 and "generated_token_ids" not in res
    assert "PADPLUGIN_STRICT=1" in res["error"] and "'use_grouped_topk'" in res["error"]
