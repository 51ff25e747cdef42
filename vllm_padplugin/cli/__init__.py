"""``vllm-padplugin``: report, compat and bench commands.

Each command lives in its own module of this package (``cli.report``, ``cli.compat``,
``cli.bench``), which registers itself on ``app``; heavy imports (torch, vLLM) happen
inside the commands, never here.  ``python -m vllm_padplugin.cli`` runs ``main``.
"""
from __future__ import annotations

import typer

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="vllm_padplugin: keep MoE padding rows out of expert routing; find vLLM drift.",
)
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (print a table, write JSON/PNG).")
app.add_typer(bench_app, name="bench")


COMMANDS = ("report", "compat", "bench")   # modules of this package; each defines register(app, bench_app)


def _register() -> None:
    import importlib

    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(app, bench_app)


def main() -> None:
    _register()
    app()


if __name__ == "__main__":
    main()
