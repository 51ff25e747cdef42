"""``vllm-padplugin``: report, compat and bench commands.

Each command lives in its own ``cmd_*`` module, which registers itself on ``app``;
heavy imports (torch, vLLM) happen inside the commands, never here.
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


def _register() -> None:
    import importlib
    import pkgutil

    import vllm_padplugin

    for mod in pkgutil.iter_modules(vllm_padplugin.__path__):
        if mod.name.startswith("cmd_"):
            importlib.import_module(f"vllm_padplugin.{mod.name}").register(app, bench_app)


def main() -> None:
    _register()
    app()


if __name__ == "__main__":
    main()
