"""``vllm-padplugin report``: the CLI in fresh processes, and the in-process report API.

No fakes except the "vLLM not installed" case, which hides vllm from the import
system of a fresh interpreter (``sys.modules['vllm'] = None``) instead of
uninstalling it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REQUIRED_KEYS = {
    "vllm_version", "platform", "plugin_version", "entry_points", "mode", "binding_sites", "drift",
    "loaded", "factory_calls", "routers_built", "masked_routers",
}
LAYER_SITE = "vllm.model_executor.layers.fused_moe.layer.create_fused_moe_router"


def cli(*args: str, **env_over: str) -> subprocess.Popen:
    env = dict(os.environ)
    for k in ("VLLM_PLUGINS", "PADPLUGIN_STRICT", "PADPLUGIN_FORCE_MODE", "PADPLUGIN_REPORT_DIR"):
        env.pop(k, None)
    env.update(env_over)
    return subprocess.Popen([sys.executable, "-m", "vllm_padplugin.cli", "report", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(vllm):
    """The CLI runs concurrently, each in a fresh interpreter."""
    procs = {
        "deep": cli("--json", "--deep"),
        "excluded": cli("--json", VLLM_PLUGINS="lora_filesystem_resolver"),
        "text": cli(),
    }
    out = {}
    for k, p in procs.items():
        stdout, stderr = p.communicate(timeout=400)
        out[k] = (p.returncode, stdout, stderr)
    return out


@pytest.mark.vllm
def test_report_json_keys_and_binding_sites(runs, vllm):
    rc, out, err = runs["deep"]
    assert rc == 0, err[-3000:]
    rep = json.loads(out)
    assert REQUIRED_KEYS <= rep.keys()
    assert rep["vllm_version"] == vllm.__version__ and rep["platform"] == "cpu"
    assert rep["loaded"] is True and rep["mode"] == "passthrough" and isinstance(rep["drift"], list)
    assert not [f for f in rep["drift"] if f["severity"] == "breaking"], rep["drift"]
    assert LAYER_SITE in rep["binding_sites"]
    assert rep["entry_points_found"] and rep["entry_points_allowed"]


@pytest.mark.vllm
def test_report_says_when_vllm_plugins_excludes_us(runs):
    rc, out, err = runs["excluded"]
    assert rc == 0, err[-3000:]
    rep = json.loads(out)
    assert rep["loaded"] is False and rep["entry_points_found"] and not rep["entry_points_allowed"]
    assert rep["vllm_plugins_env"] == "lora_filesystem_resolver"


@pytest.mark.vllm
def test_report_text(runs):
    rc, out, err = runs["text"]
    assert rc == 0, err[-3000:]
    for needle in ("vllm_padplugin 0.1.0", "mode:           passthrough", "entry points:", "allowed",
                   "drift:  "):
        assert needle in out


def test_report_without_vllm_exit_2_no_traceback():
    code = ("import sys; sys.modules['vllm'] = None; sys.argv = ['vllm-padplugin', 'report']\n"
            "from vllm_padplugin.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "vLLM is not installed" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout


def test_in_process_report_and_report_file(tmp_path, monkeypatch):
    from vllm_padplugin import report, state

    monkeypatch.setattr(state, "STATE", state.PluginState(mode="backport", installed=True, factory_calls=3,
                                                          routers_built={"GroupedTopKRouter": 3},
                                                          masked_routers=2))
    rep = report.build_report()
    assert REQUIRED_KEYS <= rep.keys()
    assert (rep["mode"], rep["factory_calls"], rep["masked_routers"]) == ("backport", 3, 2)
    assert "masked: 2" in report.format_text(rep)
    assert report.write_report_file() is None  # no dir configured: nothing written
    monkeypatch.setenv(report.REPORT_DIR_ENV, str(tmp_path / "r"))
    path = report.write_report_file()
    assert path == tmp_path / "r" / f"report-{os.getpid()}.json"
    assert json.loads(path.read_text())["routers_built"] == {"GroupedTopKRouter": 3}


def test_vllm_plugins_allow_list_semantics(monkeypatch):
    from vllm_padplugin.report import allowed_plugins, entry_points_info

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert allowed_plugins() is None
    monkeypatch.setenv("VLLM_PLUGINS", "a,padplugin")
    assert allowed_plugins() == ["a", "padplugin"]
    assert all(e["allowed"] for e in entry_points_info())
    monkeypatch.setenv("VLLM_PLUGINS", "")  # vLLM parses "" as [""]: allows nothing
    assert all(not e["allowed"] for e in entry_points_info())
