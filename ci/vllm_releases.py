#!/usr/bin/env python3
"""Fetch official vLLM release wheels and keep only their Python sources.

Why: the compat checks and the signature-parity tests read every supported vLLM
release (0.28 ... 0.34) as source, without installing them (0.33+ pin a CUDA
torch).  Sources live in a cache outside the clone, one folder per version
(~50 MB each); the ~330 MB wheels are deleted once unpacked.  Standard library only.

Usage: ci/vllm_releases.py [VERSION ...]   -> prints the cache folder on stdout;
       each version's tree is <folder>/<version>/vllm
"""
from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

RELEASES = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
DEFAULT_CACHE = Path(os.environ.get("PADPLUGIN_CACHE", Path.home() / ".cache" / "vllm_padplugin"))


def ensure(version: str, root: Path) -> Path:
    dest = root / version
    if (dest / ".complete").exists():
        return dest / "vllm"
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        print(f"[vllm_releases] downloading vllm=={version}", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--no-input", "--progress-bar", "off", "-q", "-d", tmp, f"vllm=={version}"],
            check=True, stdout=sys.stderr,
        )
        (wheel,) = Path(tmp).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.startswith("vllm/") and n.endswith(".py")]
            zf.extractall(dest, members=names)
    (dest / ".complete").touch()
    return dest / "vllm"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="*", default=list(RELEASES))
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE / "releases")
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    with open(args.cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for v in args.versions:
            ensure(v, args.cache)
    print(args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
