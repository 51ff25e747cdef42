"""``vllm-padplugin bench balance --quick``: the real command, its JSON, its PNG and its invariants.

Runs the whole simulated pipeline (router model -> the plugin's real ``mask_padded_routes`` ->
DeepEP dispatch model).  DeepEP itself is a model here (see test_bench_routers.py); no timing
is asserted.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
import torch

from vllm_padplugin.bench import balance
from vllm_padplugin.bench.routers import DEEPSEEK_V3, KIMI_STYLE

REQUIRED_KEYS = {
    "name", "router", "ep_size", "padded_rows_dispatched_without_plugin", "padded_rows_dispatched_with_plugin",
    "straggler_without_plugin", "straggler_with_plugin", "straggler_real_only", "tokens_per_rank_without_plugin",
    "tokens_per_rank_with_plugin", "tokens_per_rank_real_only",
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("balance")
    json_path, png_path = out / "balance.json", out / "balance.png"
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_padplugin.cli", "bench", "balance", "--quick",
         "--json", str(json_path), "--plot", str(png_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(json_path.read_text()), png_path, proc.stdout


def test_json_schema_and_coverage(quick_run):
    doc, _, _ = quick_run
    scenarios = doc["scenarios"]
    for s in scenarios:
        assert REQUIRED_KEYS <= s.keys(), REQUIRED_KEYS - s.keys()
        assert len(s["tokens_per_rank_without_plugin"]) == s["ep_size"]
    combos = Counter((s["router"], s["ep_size"], s["kind"], s["hidden"]) for s in scenarios)
    assert set(combos.values()) == {1}
    assert {s["router"] for s in scenarios} == {"deepseek-v3", "kimi-style"}
    assert {s["kind"] for s in scenarios} == set(balance.KINDS)
    assert {s["hidden"] for s in scenarios} == {"zero", "stale"}
    assert all(s["padded_rows"] > 0 for s in scenarios), "every scenario must actually contain padding"


def test_plugin_dispatches_no_padded_row_and_restores_real_balance(quick_run):
    doc, _, stdout = quick_run
    for s in doc["scenarios"]:
        assert s["padded_rows_dispatched_with_plugin"] == 0, s["name"]
        assert s["padded_rows_dispatched_without_plugin"] == s["padded_rows"], s["name"]  # top-k ids are >= 0
        assert s["straggler_with_plugin"] == s["straggler_real_only"], s["name"]
        assert s["tokens_per_rank_with_plugin"] == s["tokens_per_rank_real_only"], s["name"]
        assert s["real_rows_bit_identical"], s["name"]
        # dispatch is per token: without the plugin = real tokens + padding rows, rank by rank
        assert s["tokens_per_rank_without_plugin"] == [
            r + p for r, p in zip(s["tokens_per_rank_real_only"], s["padded_tokens_per_rank_without_plugin"])
        ], s["name"]
    assert "every scenario: 0 padded rows dispatched" in stdout


def test_zero_hidden_padding_piles_onto_the_same_ranks(quick_run):
    doc, _, _ = quick_run
    zero = [s for s in doc["scenarios"] if s["hidden"] == "zero"]
    for s in zero:
        per_rank = s["padded_tokens_per_rank_without_plugin"]
        # identical logits -> identical experts: every padded row lands on the same ranks, all of them
        assert set(per_rank) <= {0, s["padded_rows"]}, s["name"]
        if s["router"] == "kimi-style":  # no correction bias: ties -> experts 0..7 -> rank 0
            assert per_rank[0] == s["padded_rows"] and sum(per_rank) == s["padded_rows"], s["name"]
    worst = [s for s in zero if s["kind"] == "dp-dummy-decode"]
    assert all(s["straggler_without_plugin"] > 1.3 * s["straggler_real_only"] for s in worst), [
        (s["name"], s["straggler_without_plugin"], s["straggler_real_only"]) for s in worst]


def test_stale_padding_spreads_like_real_tokens(quick_run):
    doc, _, _ = quick_run
    for s in doc["scenarios"]:
        if s["hidden"] == "stale" and s["padded_rows"] >= 100:
            hit = sum(1 for n in s["padded_tokens_per_rank_without_plugin"] if n)
            assert hit == s["ep_size"], s["name"]


def test_png_written(quick_run):
    _, png, _ = quick_run
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_broken_mask_is_caught(monkeypatch):
    """The metrics can fail: with masking disabled, padded rows are dispatched and balance differs."""
    monkeypatch.setattr(balance, "mask_padded_routes", lambda w, i, p: (w, i))
    s = balance.run_scenario(KIMI_STYLE, 8, "dp-dummy-decode", "zero", balance.Config.quick())
    assert s["padded_rows_dispatched_with_plugin"] == s["padded_rows"] > 0
    assert s["straggler_with_plugin"] != s["straggler_real_only"]


def test_capture_size_padding():
    sizes = balance.capture_sizes()
    assert sizes[:6] == [1, 2, 4, 8, 16, 24] and sizes[-1] == 512 and 272 in sizes and 264 not in sizes
    assert [balance.pad_to_capture_size(n, sizes) for n in (1, 3, 9, 255, 257, 600)] == [1, 4, 16, 256, 272, 600]


@pytest.mark.parametrize("kind", balance.KINDS)
def test_batch_layouts(kind):
    cfg = balance.Config.quick()
    layout = balance.batch_layout(kind, 16, cfg, torch.Generator().manual_seed(0))
    assert len(layout) == 16
    if kind.startswith("sp-"):
        for group in range(0, 16, balance.TP_SIZE):
            chunk = layout[group: group + balance.TP_SIZE]
            assert len({real + pad for real, pad in chunk}) == 1  # equal chunks per TP rank
            assert sum(pad for _, pad in chunk) < balance.TP_SIZE
    else:
        sizes = {real + pad for real, pad in layout}
        assert len(sizes) == 1 and sizes.pop() in balance.capture_sizes()  # DP-synchronised, graph size
        idle = [real for real, _ in layout if real == 0]
        assert bool(idle) == (kind == "dp-dummy-decode")


def test_unknown_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="unknown scenario kind"):
        balance.batch_layout("nope", 8, balance.Config.quick(), torch.Generator())
    with pytest.raises(ValueError, match="unknown hidden-state variant"):
        balance.run_scenario(DEEPSEEK_V3, 8, "sp-decode", "noise", balance.Config.quick())
