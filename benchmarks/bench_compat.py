"""Speed of ``vllm-padplugin compat`` (targets from issue 3): prints a table, writes JSON.

  static check of one vLLM tree        <= 2 s   (CLI subprocess, wall, incl. Python start-up)
  --plugin-src on a plugin tree        <= 2 s   (CLI subprocess vs 0.31.0 sources; issue 13)
  --git over the 7-release repository  <= 30 s  (CLI subprocess; one commit per release 0.28-0.34)
  compat on the installed vLLM         <= 3 s   (CLI subprocess; vLLM located, not imported)
  runtime shim check_loaded_vllm()     (in-process, after importing the vLLM modules it checks)

Usage: python benchmarks/bench_compat.py [--json FILE] [--repeat N] [--plugin-src DIR ...]
(--plugin-src: real plugin trees fetched outside the repo; default: the gaudi_like fixture.)
Run with the Python of a vLLM venv for the last two rows (skipped without vLLM).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vllm_padplugin.compat.release_repo import RELEASES, build, releases_dir  # noqa: E402


def wall(cmd: list[str], repeat: int) -> tuple[float, int]:
    times, rc = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        times.append(time.perf_counter() - t)
        rc = p.returncode
        if rc not in (0, 1):
            raise SystemExit(f"{' '.join(cmd)} failed ({rc}): {p.stderr[-500:]}")
    return statistics.median(times), rc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "bench_compat.json"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--plugin-src", action="append", default=None,
                    help="plugin tree(s) for the --plugin-src row (default: tests' gaudi_like fixture)")
    a = ap.parse_args()
    cli = [sys.executable, "-m", "vllm_padplugin.cli", "compat"]
    rows = []
    rel = releases_dir()
    rows.append(("static check, one tree (0.32.0 sources)", 2.0,
                 *wall(cli + ["--vllm-src", str(rel / "0.32.0")], a.repeat)))
    for plugin in a.plugin_src or [str(REPO / "tests" / "fixtures" / "compat" / "plugins" / "gaudi_like")]:
        rows.append((f"--plugin-src {Path(plugin).name} vs 0.31.0 sources", 2.0,
                     *wall(cli + ["--plugin-src", plugin, "--vllm-src", str(rel / "0.31.0")], a.repeat)))
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        build(Path(tmp) / "vllm", RELEASES, rel)
        build_s = time.perf_counter() - t
        rows.append((f"--git v0.28.0..v0.34.0 (7 release commits; repo build {build_s:.1f} s not counted)",
                     30.0, *wall(cli + ["--git", str(Path(tmp) / "vllm"), "--good", "v0.28.0", "--bad",
                                        "v0.34.0"], a.repeat)))
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        rows.append(("compat on the installed vLLM", 3.0, *wall(cli, a.repeat)))
        code = ("import time, vllm.model_executor.layers.fused_moe.layer, vllm.forward_context, vllm.envs\n"
                "from vllm_padplugin.shim import check_loaded_vllm\n"
                "t=time.perf_counter(); f=check_loaded_vllm(); print(time.perf_counter()-t)")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                           env={**os.environ, "VLLM_PLUGINS": ""})
        rows.append(("runtime shim check_loaded_vllm() (in-process)", None,
                     float(p.stdout.strip().splitlines()[-1]), p.returncode))
    print(f"{'measurement':<78} {'seconds':>8} {'target':>7} {'ok':>4}  exit")
    out = []
    for name, target, secs, rc in rows:
        ok = "-" if target is None else ("yes" if secs <= target else "NO")
        print(f"{name:<78} {secs:8.2f} {target if target else '-':>7} {ok:>4}  {rc}")
        out.append({"name": name, "seconds": round(secs, 3), "target_s": target, "exit": rc})
    load = os.getloadavg()[0]
    print(f"(median of {a.repeat}; python {sys.version.split()[0]}; {os.cpu_count()} CPUs; load avg {load:.1f})")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"rows": out, "repeat": a.repeat, "cpus": os.cpu_count(),
                                        "loadavg": load}, indent=2))
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
