"""The main job: generate with a real vLLM on a tiny DeepSeek-V3 and show what the plugin did.

Why a demo and not just a report: the plugin's value is that it is active *where
the model runs*.  With V1 multiprocessing (vLLM's default) the model is built in
an engine-core/worker process, not in the process that called ``LLM(...)``.  So
the plugin writes a report file per process (``PADPLUGIN_REPORT_DIR``) and
this demo prints those next to the front process's own report.

    python -m vllm_padplugin.demo            # 1 worker, multiprocessing on
    python -m vllm_padplugin.demo --tp 2     # 2 workers (tensor parallel, mp executor)
    python -m vllm_padplugin.demo --json out.json   # everything, machine-readable

vLLM spawns processes, so everything runs under ``if __name__ == "__main__"``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPORT_DIR_ENV = "PADPLUGIN_REPORT_DIR"


def _front_report() -> dict[str, Any]:
    """This process's plugin report (the same dict ``vllm-padplugin report --json`` prints)."""
    from vllm_padplugin.report import build_report

    return build_report()


def read_process_reports(report_dir: Path) -> list[dict[str, Any]]:
    """The last report each process wrote (``report-<pid>.json``), ordered by pid."""
    out = []
    for path in sorted(report_dir.glob("report-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):  # being rewritten right now: skip, never crash the demo
            continue
        data.setdefault("pid", int(path.stem.split("-", 1)[1]))
        out.append(data)
    return sorted(out, key=lambda d: d["pid"])


def factory_calls(rep: dict[str, Any]) -> int:
    """How many routers this process built through the plugin's factory."""
    return int(rep.get("factory_calls") or 0)


def _role(rep: dict[str, Any], front_pid: int) -> str:
    """Best description of the process a report came from (reports carry no role)."""
    if rep.get("pid") == front_pid:
        return "front (called LLM)"
    if rep.get("process_name"):
        return str(rep["process_name"])
    if str(rep.get("argv0", "")).endswith("registry.py"):
        return "model-registry probe"  # vLLM 0.30 inspects the model class in a subprocess
    # The model (hence every MoE router) is built only where the model runs.
    return "worker (model here)" if factory_calls(rep) else "engine core"


def unique_drift(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drift findings of all processes, each once (every process checks the same vLLM)."""
    seen, out = set(), []
    for rep in reports:
        for d in rep.get("drift") or []:
            d = d if isinstance(d, dict) else {"detail": str(d)}
            key = (d.get("kind"), d.get("symbol"), d.get("detail"))
            if key not in seen:
                seen.add(key)
                out.append(d)
    return out


def _fmt_row(cols: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()


def summary_table(reports: list[dict[str, Any]], front_pid: int) -> str:
    head = ["pid", "process", "loaded", "mode", "routers built", "binding sites", "drift"]
    rows = [[str(r.get("pid", "?")), _role(r, front_pid), "yes" if r.get("loaded") else "NO",
             str(r.get("mode") or "-"), str(factory_calls(r)), str(len(r.get("binding_sites") or [])),
             str(len(r.get("drift") or []))] for r in reports]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    return "\n".join(_fmt_row(x, widths) for x in [head, *rows])


def _sites(rep: dict[str, Any]) -> list[str]:
    out = []
    for s in rep.get("binding_sites") or []:
        out.append(str(s))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the model, generate, collect reports.  Returns everything as a dict."""
    from vllm_padplugin.tiny_model import TINY_DEEPSEEK_V3, build_tiny_model, prompt_token_ids

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if args.no_mp:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    report_dir = Path(os.environ.get(REPORT_DIR_ENV) or tempfile.mkdtemp(prefix="padplugin-reports-"))
    report_dir.mkdir(parents=True, exist_ok=True)
    os.environ[REPORT_DIR_ENV] = str(report_dir)  # set before vLLM starts any process
    if args.tp > 1:
        # vLLM CPU binds each worker's OpenMP threads to a NUMA node; with fewer
        # nodes than workers it refuses unless told which cores each rank gets.
        ncpu = os.cpu_count() or 1
        per = max(1, ncpu // args.tp)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
            f"{(i * per) % ncpu}-{(i * per) % ncpu + per - 1}" if per > 1 else str(i % ncpu)
            for i in range(args.tp)))

    t0 = time.monotonic()
    model_dir = build_tiny_model(seed=args.seed)
    prompt = prompt_token_ids(args.prompt_len, seed=args.seed)

    from vllm import LLM, SamplingParams
    import vllm

    kwargs: dict[str, Any] = dict(
        model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True, seed=args.seed,
        max_model_len=256, max_num_seqs=4,
        kv_cache_memory_bytes=64 << 20,  # the CPU NUMA memory check refuses without it
    )
    if args.tp > 1:
        kwargs.update(tensor_parallel_size=args.tp, distributed_executor_backend="mp")
    llm = LLM(**kwargs)
    t1 = time.monotonic()
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    outs = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    tokens = list(outs[0].outputs[0].token_ids)
    t2 = time.monotonic()

    front = _front_report()
    front.setdefault("pid", os.getpid())
    procs = read_process_reports(report_dir)
    result = {
        "vllm_version": vllm.__version__,
        "model_dir": str(model_dir),
        "model": {k: TINY_DEEPSEEK_V3[k] for k in ("num_hidden_layers", "n_routed_experts", "n_group",
                                                    "topk_group", "num_experts_per_tok",
                                                    "topk_method", "scoring_func")},
        "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") not in ("0", "false"),
        "tensor_parallel_size": args.tp,
        "prompt_token_ids": prompt,
        "generated_token_ids": tokens,
        "front_pid": os.getpid(),
        "front_report": front,
        "process_reports": procs,
        "report_dir": str(report_dir),
        "seconds": {"build_and_start": round(t1 - t0, 1), "generate": round(t2 - t1, 1)},
    }
    # Every process wrote its report at plugin load and after each factory call
    # (model build), both before generate() returned, so the files are complete here.
    return result


def render(res: dict[str, Any]) -> str:
    front = res["front_report"]
    procs = res["process_reports"]
    others = [r for r in procs if r.get("pid") != res["front_pid"]]
    lines = [
        f"vLLM {res['vllm_version']} | vllm_padplugin {front.get('plugin_version', '?')} | "
        f"platform {front.get('platform', '?')}",
        f"model: tiny DeepSeek-V3 ({res['model']['num_hidden_layers']} layers, "
        f"{res['model']['n_routed_experts']} experts in {res['model']['n_group']} groups, "
        f"top-{res['model']['num_experts_per_tok']} of best {res['model']['topk_group']} groups, "
        f"{res['model']['scoring_func']} + e_score_correction_bias) at {res['model_dir']}",
        f"multiprocessing {'on' if res['multiprocessing'] else 'off'}, "
        f"tensor_parallel_size {res['tensor_parallel_size']}; "
        f"start {res['seconds']['build_and_start']} s, generate {res['seconds']['generate']} s",
        f"prompt token ids:    {res['prompt_token_ids']}",
        f"generated token ids: {res['generated_token_ids']}",
        "",
        "what the plugin did, per process (from the report each process wrote):",
        summary_table(procs or [front], res["front_pid"]),
    ]
    builders = [r for r in procs if factory_calls(r)]
    worker = (builders or others or procs or [front])[0]
    sites = _sites(worker)
    if sites:
        lines.append("rebound binding sites (in pid %s): %s" % (worker.get("pid"), ", ".join(sites)))
    drift = unique_drift(procs or [front])
    if not drift:
        lines.append("drift: none")
    else:
        lines.append(f"drift ({len(drift)} distinct finding(s) over all processes):")
        lines += [f"  [{d.get('severity', '?')}] {d.get('detail', d)}" for d in drift]
    errors = sorted({e for r in procs or [front] for e in (r.get("errors") or [])})
    lines += [f"plugin error (vLLM kept upstream behaviour): {e}" for e in errors]
    if not front.get("loaded") and not procs:
        lines.append(_not_loaded_note(front))
    else:
        lines.append(_mode_note(str(worker.get("mode", front.get("mode", "?")))))
    if res["multiprocessing"] and not [r for r in builders if r.get("pid") != res["front_pid"]]:
        lines.append("WARNING: no report from the process that built the model: "
                     "the plugin did not load there")
    return "\n".join(lines)


def _not_loaded_note(front: dict[str, Any]) -> str:
    if not front.get("entry_points_found"):
        return "the plugin did not load: its entry points are not installed (pip install vllm_padplugin)"
    if not front.get("entry_points_allowed"):
        return (f"the plugin did not load: VLLM_PLUGINS={front.get('vllm_plugins_env')!r} "
                "does not name it (vLLM treats VLLM_PLUGINS as an allow-list)")
    return "the plugin did not load in any process"


def _mode_note(mode: str) -> str:
    notes = {
        "passthrough": "mode passthrough: this platform's router is upstream's, untouched (padding masking "
                       "applies only with the DeepEP v2 all2all backend on GPU).",
        "native": "mode native: this vLLM masks padded rows itself; the plugin only keeps the factory "
                  "signature in parity.",
        "backport": "mode backport: the plugin masks padded rows (this vLLM predates the upstream fix).",
        "hpu-noop": "mode hpu-noop: HPU accepts skip_padding and does nothing with it.",
    }
    return notes.get(mode, f"mode {mode}")


def _run_engine_child(argv: list[str]) -> tuple[int, dict[str, Any] | None, Path]:
    """Run the engine part in a child process whose logs go to a file.

    vLLM's own logging, progress bars and warnings (from three processes) would
    bury the few lines that matter; they are kept in ``engine.log`` instead.
    """
    import subprocess

    work = Path(tempfile.mkdtemp(prefix="padplugin-demo-"))
    out_json, log = work / "result.json", work / "engine.log"
    env = dict(os.environ)
    env.setdefault(REPORT_DIR_ENV, str(work / "reports"))
    cmd = [sys.executable, "-m", "vllm_padplugin.demo", *argv, "--inline", "--json", str(out_json)]
    with open(log, "wb") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
    res = json.loads(out_json.read_text()) if rc == 0 and out_json.exists() else None
    return rc, res, log


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m vllm_padplugin.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel size (workers, mp executor)")
    ap.add_argument("--no-mp", action="store_true",
                    help="VLLM_ENABLE_V1_MULTIPROCESSING=0: engine in the front process (faster)")
    ap.add_argument("--json", type=Path, help="also write everything as JSON to this file")
    ap.add_argument("--verbose", action="store_true", help="show vLLM's logs (INFO) instead of a log file")
    ap.add_argument("--inline", action="store_true", help=argparse.SUPPRESS)  # the engine child
    args = ap.parse_args(argv)
    if args.inline or args.verbose:
        res = run(args)
        log = None
    else:
        # The child's own --json (appended last) wins over any the user gave.
        rc, res, log = _run_engine_child(argv)
        if res is None:
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print("\n".join(tail), file=sys.stderr)
            print(f"demo failed (exit {rc}); full vLLM log: {log}", file=sys.stderr)
            return rc or 1
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, sort_keys=True, default=str))
    if not args.inline:
        print(render(res), flush=True)
        if log is not None:
            print(f"(vLLM's own log: {log})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
