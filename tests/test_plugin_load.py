"""Loading through vLLM's real plugin machinery (entry points of the installed package).

Every case runs in a fresh interpreter (plugin loading is once per process):
general hook path, platform-hook-only path (post-import installation), loading twice,
``VLLM_PLUGINS`` excluding us, a failing load (one warning, vLLM goes on) and strict
mode (raises).  No fakes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import vllm_version_tuple

pytestmark = pytest.mark.vllm

LAYER = "vllm.model_executor.layers.fused_moe.layer"
RF = "vllm.model_executor.layers.fused_moe.router.router_factory"

PRELUDE = textwrap.dedent("""
    import json, sys
    def dump(extra=None):
        from vllm_padplugin.report import build_report
        from vllm_padplugin.router_override import is_ours
        r = build_report()
        L = sys.modules.get("LAYER")
        if L is not None:
            f = L.create_fused_moe_router
            r["layer_is_ours"] = is_ours(f)
            r["layer_inner_is_upstream"] = is_ours(f) and not is_ours(f.__padplugin_inner__) \\
                and f.__padplugin_inner__.__module__ == "RF"
        r.update(extra or {})
        print("REPORT=" + json.dumps(r, default=str))
""").replace("LAYER", LAYER).replace("RF", RF)


def _env(**env_over: str | None) -> dict:
    env = dict(os.environ)
    for k in ("VLLM_PLUGINS", "PADPLUGIN_STRICT", "PADPLUGIN_FORCE_MODE", "PADPLUGIN_REPORT_DIR"):
        env.pop(k, None)
    for k, v in env_over.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


CASES = {
    "twice": (f"""
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        from vllm_padplugin import state
        platform_hook_called_by_vllm = state.STATE.platform_hook_ran
        import vllm_padplugin
        vllm_padplugin.register(); vllm_padplugin.register_platform(); vllm_padplugin.register()
        import {LAYER}
        import os
        dump({{"pid": os.getpid(), "platform_hook_called_by_vllm": platform_hook_called_by_vllm}})
    """, {"PADPLUGIN_REPORT_DIR": "<tmp>", "VLLM_TARGET_DEVICE": "cpu"}),
    "platform_only": (f"""
        from vllm.platforms import current_platform
        current_platform.device_type
        from vllm_padplugin import state
        before = state.STATE.installed
        import {LAYER}
        dump({{"installed_before_import": before}})
    """, {}),
    "excluded": ("""
        from vllm.platforms import current_platform
        current_platform.device_type
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        dump()
    """, {"VLLM_PLUGINS": "lora_filesystem_resolver"}),
    "failing": (f"""
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        import {LAYER}
        dump()
    """, {"PADPLUGIN_FORCE_MODE": "bogus"}),
    "strict": ("""
        from vllm.plugins import load_general_plugins
        load_general_plugins()
    """, {"PADPLUGIN_FORCE_MODE": "bogus", "PADPLUGIN_STRICT": "1"}),
}


@pytest.fixture(scope="module")
def runs(vllm, tmp_path_factory):
    """Start every case in its own fresh interpreter, concurrently (each pays vLLM's import)."""
    tmp = tmp_path_factory.mktemp("reports")
    procs = {}
    for name, (code, env_over) in CASES.items():
        env_over = {k: (str(tmp) if v == "<tmp>" else v) for k, v in env_over.items()}
        procs[name] = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                                       env=_env(**env_over), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=400)
        rep = None
        for line in stdout.splitlines():
            if line.startswith("REPORT="):
                rep = json.loads(line[len("REPORT="):])
        out[name] = (p.returncode, stdout, stderr, rep)
    out["_tmp"] = tmp
    return out


def test_general_hook_installs_once_even_if_loaded_twice(runs):
    """VLLM_TARGET_DEVICE=cpu: vLLM never calls platform plugins; the general hook does the
    job.  Our platform hook is then called by hand too: still one installation."""
    rc, _, err, rep = runs["twice"]
    assert rc == 0, err[-3000:]
    assert rep["loaded"] and rep["hooks"]["general"] and rep["mode"] == "passthrough"
    assert rep["platform_hook_called_by_vllm"] is False
    assert rep["layer_is_ours"] and rep["layer_inner_is_upstream"], "wrapped exactly once"
    assert f"{LAYER}.create_fused_moe_router" in rep["binding_sites"]
    assert f"{RF}.create_fused_moe_router" in rep["binding_sites"]
    assert rep["applied_patches"][0] == "router_factory" and rep["errors"] == []
    assert {(e["group"], e["allowed"]) for e in rep["entry_points"]} == {
        ("vllm.platform_plugins", True), ("vllm.general_plugins", True)}


def test_report_dir_file_written_at_load(runs):
    rc, _, err, rep = runs["twice"]
    assert rc == 0, err[-3000:]
    data = json.loads((runs["_tmp"] / f"report-{rep['pid']}.json").read_text())
    assert data["loaded"] and data["pid"] == rep["pid"] and data["mode"] == "passthrough"


def test_platform_hook_alone_installs_after_factory_import(runs):
    """Platform resolution calls our platform hook, which only arranges a post-import
    installation: importing vLLM's MoE layer later installs the override."""
    rc, _, err, rep = runs["platform_only"]
    assert rc == 0, err[-3000:]
    assert rep["hooks"] == {"platform": True, "general": False}
    assert rep["installed_before_import"] is False
    assert rep["loaded"] and rep["layer_is_ours"] and rep["layer_inner_is_upstream"]


def test_vllm_plugins_excluding_us(runs):
    rc, _, err, rep = runs["excluded"]
    assert rc == 0, err[-3000:]
    assert rep["loaded"] is False and rep["hooks"] == {"platform": False, "general": False}
    assert rep["entry_points_found"] and not rep["entry_points_allowed"]
    assert all(not e["allowed"] for e in rep["entry_points"])


def test_failing_load_warns_once_and_vllm_continues(runs):
    rc, out, err, rep = runs["failing"]
    assert rc == 0, err[-3000:]
    warnings = [line for line in (out + err).splitlines() if "vllm_padplugin:" in line
                and "failed" in line and not line.startswith("REPORT=")]
    assert len(warnings) == 1 and "PADPLUGIN_FORCE_MODE='bogus'" in warnings[0]
    assert rep["errors"] and not rep["layer_is_ours"], "upstream factory left in place"


def test_strict_mode_raises_at_load(runs):
    rc, _, err, _ = runs["strict"]
    assert rc != 0
    assert "RuntimeError: vllm_padplugin:" in err and "PADPLUGIN_STRICT=1" in err


@pytest.mark.parametrize("device,expect", [("hpu", "hpu-noop"), ("cpu", "passthrough"),
                                           ("rocm", "passthrough"), ("xpu", "passthrough"),
                                           ("tpu", "passthrough")])
def test_mode_table(device, expect):
    from vllm_padplugin.platforms import mode_for

    assert mode_for(device, True) == expect and mode_for(device, False) == expect


def test_cuda_mode_from_installed_vllm(vllm, monkeypatch):
    """The CUDA decision reads the installed vLLM (real objects / real sources): native
    from 0.31 on, backport before.  Only the device type is given (no GPU here)."""
    from vllm_padplugin.platforms import decide_mode

    monkeypatch.delenv("PADPLUGIN_FORCE_MODE", raising=False)
    expect = "native" if vllm_version_tuple() >= (0, 31) else "backport"
    assert decide_mode("cuda") == expect


def test_cuda_mode_from_sources_without_import(releases_dir, monkeypatch, tmp_path):
    """Before fused_moe is imported the decision reads sources (ast): 0.30 -> backport,
    0.31 -> native.  A FAKE ``vllm`` module object points at the release sources."""
    import types

    from vllm_padplugin import platforms

    for version, expect in (("0.30.0", False), ("0.31.0", True)):
        fake = types.ModuleType("vllm")
        fake.__file__ = str(releases_dir / version / "vllm" / "__init__.py")
        monkeypatch.setitem(sys.modules, "vllm", fake)
        monkeypatch.delitem(sys.modules, RF, raising=False)
        assert platforms.upstream_masks_natively() is expect, version
