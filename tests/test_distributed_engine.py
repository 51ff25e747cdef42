"""Distributed engine on a real vLLM (CPU build): two tensor-parallel workers, the plugin in each.

vLLM's multiprocessing executor (``distributed_executor_backend="mp"``) starts
one worker process per rank; the ranks all-reduce over gloo.  The plugin must
load in every worker and build that worker's MoE routers.  Run through the main
job (``python -m vllm_padplugin.demo --tp 2``) in a subprocess; each process's
plugin report (``PADPLUGIN_REPORT_DIR``) shows what happened inside it.
No fakes.

vLLM CPU binds each worker's OpenMP threads to its own NUMA node and refuses
("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers") on a
one-node machine unless ``VLLM_CPU_OMP_THREADS_BIND`` gives one core list per
rank; the demo sets it ("0|1" on 2 cores) when the user has not.
"""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("transformers")

from test_e2e_engine import N_MOE_LAYERS, run_demo  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def tp2(tmp_path_factory) -> dict:
    return run_demo(tmp_path_factory.mktemp("tp2"), "tp2", "--tp", "2")


def test_each_of_two_workers_loads_the_plugin_and_builds_its_routers(tp2):
    assert tp2["tensor_parallel_size"] == 2 and tp2["multiprocessing"] is True
    reports = {r["pid"]: r for r in tp2["process_reports"]}
    front = tp2["front_pid"]
    assert front in reports and reports[front]["factory_calls"] == 0
    workers = {pid: r for pid, r in reports.items() if r["factory_calls"]}
    # one worker process per rank, none of them the front process
    assert len(workers) == 2 and front not in workers, {p: r["factory_calls"] for p, r in reports.items()}
    for pid, rep in workers.items():
        assert rep["loaded"] is True and rep["mode"] == "passthrough", (pid, rep["mode"])
        assert rep["factory_calls"] == N_MOE_LAYERS, (pid, rep["factory_calls"])
        assert sum(rep["routers_built"].values()) == N_MOE_LAYERS, (pid, rep["routers_built"])
        assert any(s.endswith(".create_fused_moe_router") for s in rep["binding_sites"]), rep["binding_sites"]
        assert rep["errors"] == [], (pid, rep["errors"])
    for rep in reports.values():
        assert rep["loaded"] is True


def test_tensor_parallel_generation_completes(tp2):
    toks = tp2["generated_token_ids"]
    assert len(toks) == 16 and all(0 <= t < 512 for t in toks)
