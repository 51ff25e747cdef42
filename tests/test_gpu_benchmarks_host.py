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
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_masking  # noqa: E402
import gpu_session  # noqa: E402
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
    # a candidate's own mask wins over --padding's: the mask's cost timed against the unmasked build
    calls = kernel_ab.variants(None, dict([kernel_ab.parse_candidate("m:padding=none,max_registers=72")]))
    assert calls["served"] == {"padding": None} and calls["m"] == {"padding": "none", "max_registers": 72}
    assert kernel_ab.parse_candidate("u:padding=off") == ("u", {"padding": None})
    for bad in ("top4", "served:a=1", "x:top4", "x:top4=b c", "x:1=2", "x:nope=1", "x:topk=8", "x:padding=all"):
        with pytest.raises(kernel_ab.argparse.ArgumentTypeError):  # malformed, or not one of the kernel's
            kernel_ab.parse_candidate(bad)                         # launch options: an error, never ignored


def test_launch_reaches_every_fused_launch_of_the_table(fake_graphs, monkeypatch):
    """``gpu_masking.py --launch``: the table of an experiment as if served; its keyword
    arguments must reach every timed ``fused_grouped_topk`` call (the real function, watched)."""
    launch = gpu_masking.parse_kwargs("pair_union=True,top4=False")
    seen = []
    real = gpu_masking.fused_grouped_topk

    def watched(*a, **kw):
        seen.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(gpu_masking, "fused_grouped_topk", watched)
    r = gpu_masking.bench_route("deepseek-v3", "fp32", 24, "cpu", torch.Generator().manual_seed(0), 1e9, None, (),
                                launch)
    assert gpu_masking.output_ok(r["check"]) and len(seen) >= 7
    assert all(kw["pair_union"] is True and kw["top4"] is False for kw in seen)


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


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _stage(name, code, limit_s=30.0, min_s=0.0):
    return gpu_session.Stage(name, ("{py}", "-c", code), limit_s, min_s)


def test_session_runs_stages_in_order_kills_at_the_deadline_and_skips_what_has_no_time(tmp_path, capsys):
    """Real subprocesses: a stage past its limit is killed with what it started (its child's
    sleep would hold the pipe open) and its output so far kept; a stage needing more than is
    left of the budget is skipped and said so; the next one still runs; a ``--vllm-src`` that is
    not here is dropped with a line that says so; a program that is not here (ncu on a machine
    without it) is recorded, not raised."""
    hang = ("import subprocess, sys, time; print('started', flush=True); sys.stdout.write('no newline'); "
            "sys.stdout.flush(); subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(60)")
    pid_file = tmp_path / "child.pid"
    leave = ("import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
             f"open({str(pid_file)!r}, 'w').write(str(c.pid))")
    plan = [_stage("first", "print('one')"), _stage("hang", hang, limit_s=2), _stage("greedy", "pass", min_s=1e6),
            _stage("leaves", leave, limit_s=20), _stage("last", "import sys; print('{out}' != ''); sys.exit(3)"),
            gpu_session.Stage("src", ("{py}", "-c", "import sys; print(sys.argv[1:])", "--vllm-src", "no/such.tar.xz",
                                      "x"), 30, 0),
            gpu_session.Stage("absent", ("no-such-program-here", "--help"), 30, 0)]
    t0 = time.monotonic()
    recs = gpu_session.run_plan(plan, tmp_path / "out", budget_s=60)
    assert time.monotonic() - t0 < 15  # "leaves" ended at once: its child holding the pipe is not waited for
    assert [(r["stage"], r["rc"], r["timed_out"]) for r in recs] == [
        ("first", 0, False), ("hang", -9, True), ("greedy", None, False), ("leaves", 0, False), ("last", 3, False),
        ("src", 0, False), ("absent", 127, False)]
    assert (tmp_path / "out" / "src.txt").read_text() == "['x']\n"  # a --vllm-src that did not travel: dropped,
    assert "no/such.tar.xz did not travel" in capsys.readouterr().out  # and said so
    child, deadline = int(pid_file.read_text()), time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)  # killed with its stage, not left to run beside the next one
    assert "needs 1000000" in recs[2]["skipped"]
    assert (tmp_path / "out" / "first.txt").read_text() == "one\n"
    assert (tmp_path / "out" / "hang.txt").read_text() == "started\nno newline"
    assert json.loads((tmp_path / "out" / "session.json").read_text()) == recs


def test_session_plan_parses_on_this_machine(tmp_path):
    """Every benchmark stage of the committed plan that our Python runs (not ncu's profile) gets
    past its argument parsing here and stops only for want of a GPU (exit 2, "no CUDA device"): a
    typo in the plan shows before a scarce device call would spend its time on it."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the plan would measure")
    plan = [s for s in gpu_session.PLAN if s.argv[0] == "{py}" and "pytest" not in s.argv]  # not ncu, pytest
    assert plan and len(plan) < len(gpu_session.PLAN)
    recs = gpu_session.run_plan(plan, tmp_path, budget_s=600)
    for stage, rec in zip(plan, recs):
        text = (tmp_path / f"{stage.name}.txt").read_text()
        assert rec["rc"] == 2 and "no CUDA device" in text and "error:" not in text, (stage.name, text[-800:])
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_session.py"), "--only", "nope"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "invalid choice: 'nope'" in p.stderr
