"""``vllm-padplugin bench balance`` and ``bench load``: print a table, write JSON (and a PNG)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def balance(
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write the scenarios as JSON here."),
    plot_file: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG bar chart of tokens per rank here."),
    quick: bool = typer.Option(False, "--quick", help="Smaller run (EP 8/16, short prefill) for tests."),
) -> None:
    """Simulate DeepEP dispatch of padded batches with and without the plugin's masking."""
    from rich.console import Console

    from vllm_padplugin.bench import balance as bench

    doc = bench.run(bench.Config.quick() if quick else bench.Config())
    console = Console()
    if not console.is_terminal:  # logs and CI: keep the whole table readable
        console = Console(width=170)
    console.print(bench.render_table(doc))
    bad = [s["name"] for s in doc["scenarios"] if s["padded_rows_dispatched_with_plugin"]
           or s["straggler_with_plugin"] != s["straggler_real_only"]]
    console.print(f"{len(doc['scenarios'])} scenarios in {doc['elapsed_s']:.1f} s "
                  f"({doc['torch_threads']} torch threads); "
                  + (f"[red]targets missed in {bad}[/red]" if bad else
                     "[green]every scenario: 0 padded rows dispatched with the plugin, "
                     "straggler with plugin == real tokens only[/green]"))
    if json_file:
        _write_json(json_file, doc)
        console.print(f"JSON: {json_file}")
    if plot_file:
        try:
            import matplotlib  # noqa: F401  (the plot's only extra dependency)
        except ImportError:
            console.print("[red]error:[/red] --plot needs matplotlib (pip install 'vllm_padplugin[test]')")
            raise typer.Exit(2) from None
        plot_file.parent.mkdir(parents=True, exist_ok=True)
        bench.plot(doc, str(plot_file))
        console.print(f"plot: {plot_file}")
    if bad:
        raise typer.Exit(1)


def load(
    python: str = typer.Option(sys.executable, "--python", help="Interpreter with vLLM and the plugin installed."),
    repeats: int = typer.Option(10, "--repeats", "-n", min=1, help="Fresh processes per variant (median)."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write the measurement as JSON here."),
    explain: bool = typer.Option(True, "--explain/--no-explain", help="Also list modules only the plugin imports."),
    cache_off: bool = typer.Option(True, "--cache-off/--no-cache-off",
                                   help="Also time loads with PADPLUGIN_INSTALL_CACHE=0 (an install's first process)."),
) -> None:
    """Time import vllm + platform resolution + plugin loading, plugin allowed vs excluded."""
    from rich.console import Console
    from rich.table import Table

    from vllm_padplugin.bench import load as bench

    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    try:
        doc = bench.run(python, repeats, cache_off=cache_off)
        if explain:
            doc["explain"] = bench.explain(python)
    except bench.LoadBenchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    table = Table(title=f"vLLM start-up with/without vllm_padplugin (median of {repeats} fresh processes)")
    for col in ("phase", "plugin off [ms]", "plugin on [ms]", "delta [ms]"):
        table.add_column(col, justify="right" if col != "phase" else "left")
    off, on = doc["median_s"]["plugin_off"], doc["median_s"]["plugin_on"]
    for phase in ("import_vllm_s", "platform_s", "general_plugins_s", "total_s", "process_wall_s"):
        table.add_row(phase[:-2], f"{1000 * off[phase]:.1f}", f"{1000 * on[phase]:.1f}",
                      f"{1000 * (on[phase] - off[phase]):+.1f}")
    console.print(table)
    target = doc["target_pct"]

    def verdict(pct: float) -> str:
        return "[green]within[/green]" if pct <= target else "[red]over[/red]"

    console.print(f"overhead, whole start-up (median on / median off total): {doc['overhead_pct']:+.2f} % "
                  f"({doc['overhead_ms']:+.1f} ms), {verdict(doc['overhead_pct'])} the {target:g} % target "
                  "(machine noise in 'import vllm' dominates this figure)")
    lo, hi = doc["in_plugin_hooks_ms_min_max"]
    console.print(f"time inside the plugin's hooks (median, {', '.join(f'{n} {w}' for n, w in doc['hooks_called'])}): "
                  f"{doc['in_plugin_hooks_ms']:.1f} ms ({lo:.1f}-{hi:.1f}) = {doc['in_plugin_hooks_pct']:.2f} % of vLLM's "
                  f"own start-up, {verdict(doc['in_plugin_hooks_pct'])} the {target:g} % target "
                  f"(drift check: {', '.join(doc['drift_cache'])}; plugin bytecode present: "
                  f"{100 * doc['plugin_bytecode']:.0f} %)")
    if doc.get("cache_off"):
        c = doc["cache_off"]
        console.print(f"  with PADPLUGIN_INSTALL_CACHE=0 (an install's first process; the full drift check): "
                      f"{c['in_plugin_hooks_ms']:.1f} ms = {c['in_plugin_hooks_pct']:.2f} %")
    if doc["hook_overhead_pct"] is None:
        console.print("hook-phase difference: n/a (this vLLM runs our hooks inside 'import vllm')")
    else:
        console.print(f"hook-phase difference (platform + general plugins, on - off): {doc['hook_overhead_pct']:+.2f} % "
                      f"({doc['hook_overhead_ms']:+.1f} ms), {verdict(doc['hook_overhead_pct'])} the {target:g} % target")
    if explain:
        ex = doc["explain"]
        console.print(f"modules imported only with the plugin on: {ex['extra_module_count']}, "
                      f"self time {ex['extra_modules_total_self_ms']:.1f} ms (one -X importtime run)")
        for m in ex["extra_modules"]:
            console.print(f"  {m['self_ms']:8.2f} ms self  {m['cumulative_ms']:8.2f} ms cum  {m['module']}")
        prof = ex["profile_plugin_on"]
        console.print("cProfile of platform resolution + load_general_plugins (plugin on; profiling inflates times):")
        console.print("  plugin functions by cumulative time:")
        for r in prof["plugin_functions_by_cumulative"][:10]:
            console.print(f"  {r['cumulative_ms']:8.1f} ms cum {r['self_ms']:8.1f} ms self  {r['function']}")
        console.print("  all functions by self time:")
        for r in prof["all_functions_by_self"][:8]:
            console.print(f"  {r['self_ms']:8.1f} ms self x{r['ncalls']:<5} {r['function']}")
        parses = ex["ast_parses_plugin_on"]
        console.print(f"ast.parse during the hooks: {len(parses)} files, {sum(p['ms'] for p in parses):.1f} ms (one run):")
        for p in parses[:6]:
            console.print(f"  {p['ms']:8.1f} ms {p['chars']:8d} chars  {p['file']}")
    if json_file:
        _write_json(json_file, doc)
        console.print(f"JSON: {json_file}")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    bench_app.command("balance")(balance)
    bench_app.command("load")(load)
