"""The GPU benchmarks' host side, run here before a scarce device call does.

``gpu_masking.interleaved`` (used by ``mask_cost.py`` and ``kernel_ab.py``) checks every variant
against the torch reference, captures each into a CUDA graph and replays the graphs in rotated
rounds.  CUDA graphs cannot run on this machine, so these tests replace ``capture_graph`` /
``replay_us`` with a fake that calls the captured launches once and returns a made-up time per
replay (a fake only for what cannot run here); the launches themselves are the real
``fused_grouped_topk`` (its CPU path), the checks and the statistics are the real ones.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_masking  # noqa: E402
import kernel_ab  # noqa: E402
import mask_cost  # noqa: E402


@pytest.fixture
def fake_graphs(monkeypatch):
    """capture_graph -> (launches, 1); replay_us -> runs the first launch, returns 10, 11, 12, ..:
    the order of the replays is recorded."""
    order = []
    counter = iter(range(10, 10 ** 6))

    def capture(fns, *, target_ms=5.0, max_inner=200):
        return list(fns) if isinstance(fns, (list, tuple)) else [fns], 1

    def replay(g, inner):
        g[0]()
        order.append(id(g))
        return float(next(counter))

    monkeypatch.setattr(gpu_masking, "capture_graph", capture)
    monkeypatch.setattr(gpu_masking, "replay_us", replay)
    monkeypatch.setattr(gpu_masking, "ROTATE_BYTES", 1)  # one input set: a CPU run needs no L2 defeat
    return order


@pytest.mark.parametrize("router", ["deepseek-v3", "kimi-style"])
def test_interleaved_checks_rotates_and_compares(fake_graphs, router):
    calls = kernel_ab.variants("none")
    r = gpu_masking.interleaved(router, "fp32", 40, "cpu", torch.Generator().manual_seed(0), calls, 6, 1.0, "served")
    assert set(r["checks"]) == set(calls) and all(gpu_masking.output_ok(c) for c in r["checks"].values())
    n = len(calls)
    rounds = [fake_graphs[i * n:(i + 1) * n] for i in range(6)]
    assert all(len(set(rd)) == n for rd in rounds)  # each variant once a round
    assert rounds[1] == rounds[0][1:] + rounds[0][:1]  # in an order rotated by one
    us = r["us_rounds"]
    want = statistics.median(100 * (a / b - 1) for a, b in zip(us["short_chain"], us["served"]))
    assert r["short_chain_pct"]["median"] == pytest.approx(want)
    assert "served_pct" not in r and r["bytes"] == 40 * gpu_masking.ROUTERS[router]["num_experts"] * 4 + 40 * 8 * 8


def test_candidate_argument_parses_literals_and_rejects_the_rest():
    assert kernel_ab.parse_candidate("top4:short_chain=True,top4=1") == ("top4", {"short_chain": True, "top4": 1})
    calls = kernel_ab.variants("none", dict([kernel_ab.parse_candidate("x:block_m=2")]))
    assert list(calls) == ["served", "again", "x"] and calls["x"] == {"block_m": 2, "padding": "none"}
    for bad in ("top4", "served:a=1", "x:a", "x:a=b c", "x:1=2"):
        with pytest.raises(kernel_ab.argparse.ArgumentTypeError):
            kernel_ab.parse_candidate(bad)


def test_tables_plots_and_json(fake_graphs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    gen = torch.Generator().manual_seed(1)
    for mod, calls, base in ((kernel_ab, kernel_ab.variants("pad25"), "served"), (mask_cost, mask_cost.CALLS, "none")):
        doc = {"device": "cpu", "torch": torch.__version__, "triton": "-", "copy_bandwidth": {"GBps": 1.0},
               "padding": "pad25", "rounds": 5, "variants": list(calls), "cases": []}
        for T in (8, 64):
            r = gpu_masking.interleaved("deepseek-v3", "bf16", T, "cpu", gen, calls, 5, 1.0, base)
            assert all(gpu_masking.output_ok(c) for c in r["checks"].values())
            r["limit_us"] = r["bytes"] / 1e3
            doc["cases"].append(r)
        mod.print_table(doc)
        mod.plot(doc, str(tmp_path / f"{mod.__name__}.png"))
        assert (tmp_path / f"{mod.__name__}.png").stat().st_size > 10_000
        json.dumps(doc)
    out = capsys.readouterr().out
    assert "short_chain %" in out and "nopad_loads %" in out


def test_scripts_say_no_device_and_exit_2():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the scripts would measure")
    for script in ("kernel_ab.py", "mask_cost.py"):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), "--tokens", "16"],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 2 and "no CUDA device" in p.stderr, (script, p.stderr[-500:])
