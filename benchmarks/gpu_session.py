"""One device call that runs the next GPU measurements in stages, each under its own time limit.

Why: device time is 30 minutes a session, a start often fails (RESULTS.md: whole sessions got no
GPU), and a call's files come back only when it ends.  So one call does everything, every stage
gets a deadline inside the call's budget, a stage whose time is gone is skipped (said so, not
silently), and a stage stopped at its deadline keeps what it wrote under ``--out``.  The stage
list lives here, in the repository, so a new checkout can send it without rebuilding anything.

``PLAN`` is what issue 11 needs next, in order: the A/B of ``flat_loads`` (the logits loaded
lane-fastest, 2.6-6.8 % fewer instructions with the device's Triton 3.6), ``bf16_pairs`` (bf16
converted two a register, 2 % fewer) and ``pad_reload`` (the padding flag loaded again for the
writes; all prepared 2026-12-07, not timed yet: every variant against the unmasked served build,
unmasked and with the mask, nothing padded, and the three together masked), float32 logits first
(the only ones the router serves the fused kernel for), then 16-bit ones, the
GPU tests of those three, an Nsight Compute profile of the served launches with the first two, the
served table (``gpu_masking.py``) with vLLM's own grouped top-k beside it where ``VLLM_SRC``
travelled (carry ``.device``; the two vLLM files ``benchmarks/vllm_grouped_topk.py`` reads:
``tar -C <vLLM 0.32.0 release tree> -cJf .device/vllm-0.32.0-grouped_topk.tar.xz
vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py vllm/model_executor/utils.py``),
the mask's cost timed interleaved (``mask_cost.py``), the GPU tests of the served path and its
variants, and an Nsight Compute profile of the served build masked and not.  Without the first
three stages it ran on an H100 and on an H200 on 2026-12-07 (benchmarks/RESULTS.md).

    python benchmarks/gpu_session.py --out "$OUT"               # on the device (run tool)
    python benchmarks/gpu_session.py --out "$OUT" --budget 240 --only served tests
    python benchmarks/gpu_session.py --list
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_SRC = ".device/vllm-0.32.0-grouped_topk.tar.xz"


@dataclass(frozen=True)
class Stage:
    """``argv`` (``{py}`` = this Python, ``{out}`` = the output folder) run from the repository root
    for at most ``limit_s``; skipped when less than ``min_s`` of the call's budget is left."""
    name: str
    argv: tuple[str, ...]
    limit_s: float
    min_s: float = 30.0


NEW_VARIANTS = "flat or bf16_pairs or pad_reload"  # prepared 2026-12-07, never run on a GPU
NEW_TESTS = f"gpu and variants and ({NEW_VARIANTS})"
SERVED_TESTS = ("gpu and ((matches_reference or wide_lanes or ties_lowest_id or in_cuda_graph) and not tile"
                " and not rows and not parts and not variants"
                f" or variants and (top4 or pair_union) and not ({NEW_VARIANTS}))")
# fp32 logits first: the only ones the router serves the fused kernel for (RESULTS.md, "Which rows of the tables
# the plugin serves"); bf16_pairs acts on bf16 logits only
AB_FP32 = ("--candidate", "f:flat_loads=True", "--candidate", "m:padding=none",
           "--candidate", "mr:padding=none,pad_reload=True", "--candidate", "mfr:padding=none,flat_loads=True,pad_reload=True")
AB_16BIT = ("--candidate", "f:flat_loads=True", "--candidate", "fp:flat_loads=True,bf16_pairs=True",
            "--candidate", "m:padding=none", "--candidate", "mfp:padding=none,flat_loads=True,bf16_pairs=True",
            "--candidate", "mr:padding=none,pad_reload=True",
            "--candidate", "mfpr:padding=none,flat_loads=True,bf16_pairs=True,pad_reload=True")
AB_TOKENS = ("--tokens", "1024", "4096", "8192", "16384", "32768", "--rounds", "15")
# Nsight Compute of profile_grouped_topk's launches (per case no mask, 25 % padded, mask with nothing
# padded; the command of RESULTS.md's ncu sections): where the served build spends its time
NCU = ("ncu", "--clock-control", "none", "-k", "regex:_grouped_topk_regs", "--section", "WarpStateStats",
       "--section", "SchedulerStats", "--section", "Occupancy", "--metrics",
       "smsp__inst_executed.sum,gpu__time_duration.sum,launch__registers_per_thread,dram__bytes_read.sum",
       "{py}", "benchmarks/profile_grouped_topk.py")
PLAN = (
    Stage("ab_fp32", ("{py}", "benchmarks/kernel_ab.py", "--padding", "off", *AB_TOKENS, "--dtypes", "fp32", *AB_FP32,
                      "--json", "{out}/kernel_ab_fp32.json", "--plot", "{out}/kernel_ab_fp32.png"), 120, 60),
    Stage("ab_16bit", ("{py}", "benchmarks/kernel_ab.py", "--padding", "off", *AB_TOKENS, "--dtypes", "bf16", *AB_16BIT,
                       "--json", "{out}/kernel_ab_16bit.json", "--plot", "{out}/kernel_ab_16bit.png"), 170, 60),
    Stage("new_tests", ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_triton_kernels.py",
                        "-k", NEW_TESTS), 180),
    # the same launches with flat_loads and bf16_pairs: do the instructions SASS counts save show as time
    Stage("ncu_flat", (*NCU, "--launch", "flat_loads=True,bf16_pairs=True"), 150, 60),
    Stage("served", ("{py}", "benchmarks/gpu_masking.py", "--skip-mask-table",
                     "--tokens", "16", "256", "1024", "4096", "8192", "16384", "32768",
                     "--vllm-src", VLLM_SRC, "--json", "{out}/gpu_masking.json",
                     "--plot", "{out}/gpu_masking.png"), 200, 60),
    Stage("mask_cost", ("{py}", "benchmarks/mask_cost.py", "--tokens", "4096", "16384", "32768", "--rounds", "21",
                        "--json", "{out}/mask_cost.json", "--plot", "{out}/mask_cost.png"), 140, 60),
    Stage("tests", ("{py}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_triton_kernels.py",
                    "-k", SERVED_TESTS), 280),  # 200 s ran out on a fresh H200 (kernels compiling)
    Stage("ncu", NCU, 150, 60),
)


def command(stage: Stage, out: Path) -> list[str]:
    """The stage's argv filled in; ``--vllm-src X`` dropped where X did not travel."""
    argv = [a.format(py=sys.executable, out=out) for a in stage.argv]
    if "--vllm-src" in argv:
        i = argv.index("--vllm-src")
        if not (ROOT / argv[i + 1]).exists():
            del argv[i:i + 2]
    return argv


def run_plan(plan, out: Path, budget_s: float, clock=time.monotonic) -> list[dict]:
    """Runs ``plan`` in order within ``budget_s`` seconds; a stage's stdout + stderr go to
    ``out/<name>.txt`` (and to ours); returns one record a stage: rc (None: skipped), seconds,
    timed_out, and why where skipped."""
    out.mkdir(parents=True, exist_ok=True)
    start, records = clock(), []
    for stage in plan:
        left = budget_s - (clock() - start)
        rec = {"stage": stage.name, "rc": None, "seconds": 0.0, "timed_out": False}
        if left < stage.min_s:
            rec["skipped"] = f"{left:.0f} s of the budget left, the stage needs {stage.min_s:.0f}"
            print(f"== {stage.name}: skipped ({rec['skipped']})", flush=True)
        else:
            _run_stage(stage, out, min(stage.limit_s, left), rec, clock)
        records.append(rec)
        (out / "session.json").write_text(json.dumps(records, indent=1))
    return records


def _run_stage(stage: Stage, out: Path, limit: float, rec: dict, clock) -> None:
    """Runs one stage for at most ``limit`` seconds into ``rec``."""
    argv = command(stage, out)
    if "--vllm-src" in stage.argv and "--vllm-src" not in argv:
        src = stage.argv[stage.argv.index("--vllm-src") + 1]
        print(f"== {stage.name}: {src} did not travel: vLLM's own grouped top-k is not timed", flush=True)
    print(f"== {stage.name} (at most {limit:.0f} s): {' '.join(argv)}", flush=True)
    t0 = clock()
    with open(out / f"{stage.name}.txt", "wb") as log:
        try:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        except OSError as e:  # e.g. no ncu on this machine: said, and the next stage still runs
            log.write(f"{e}\n".encode())
            rec.update(rc=127, error=str(e))
            print(f"== {stage.name}: could not start: {e}", flush=True)
            return
        try:
            _tee(proc, log, t0 + limit, clock)
            proc.wait(timeout=max(0.0, t0 + limit - clock()))
        except subprocess.TimeoutExpired:
            rec["timed_out"] = True
        finally:  # what it started goes too, so that nothing of it runs beside the next stage
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
    rec.update(rc=proc.returncode, seconds=round(clock() - t0, 1))
    print(f"== {stage.name}: rc {rec['rc']}{' (timed out)' if rec['timed_out'] else ''} in {rec['seconds']} s",
          flush=True)


def _tee(proc: subprocess.Popen, log, deadline: float, clock) -> None:
    """Copies ``proc``'s output to ``log`` and our stdout as it comes (pytest's dots end no line)
    until the output ends or ``deadline`` passes."""
    fd = proc.stdout.fileno()
    while (left := deadline - clock()) > 0:
        if not select.select([fd], [], [], min(1.0, left))[0]:
            if proc.poll() is not None:  # it ended; something it started holds the pipe open
                return
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        log.write(chunk)
        log.flush()
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for the stages' output ($OUT on the device)")
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole call (default 540)")
    ap.add_argument("--only", nargs="*", default=None, choices=[s.name for s in PLAN],
                    help="run only these stages, in PLAN's order")
    ap.add_argument("--list", action="store_true", help="print the stages and exit")
    args = ap.parse_args()
    plan = [s for s in PLAN if args.only is None or s.name in args.only]
    if args.list:
        for s in plan:
            print(f"{s.name:<24} <= {s.limit_s:>4.0f} s  {' '.join(command(s, Path('OUT')))}")
        return 0
    if args.out is None:
        ap.error("--out is needed (or --list)")
    records = run_plan(plan, args.out, args.budget)
    print(json.dumps(records))
    return 0 if all(r["rc"] == 0 for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
