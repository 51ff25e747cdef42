"""vllm_padplugin: keep MoE padding rows out of expert routing, across vLLM versions.

The two entry points below are what vLLM's plugin loader calls.  They import
nothing from vLLM at module import time (like vllm-gaudi's ``register()``), so
loading the entry point can never re-enter vLLM's own plugin loader.
"""
from __future__ import annotations

__version__ = "0.1.0"


def register_platform() -> None:
    """``vllm.platform_plugins`` hook: never claims a platform (returns None)."""
    from vllm_padplugin.plugin import on_platform_hook

    on_platform_hook()
    return None


def register() -> None:
    """``vllm.general_plugins`` hook: installs the patches (idempotent)."""
    from vllm_padplugin.plugin import on_general_hook

    on_general_hook()
