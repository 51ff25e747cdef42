"""What a patch is: one block per patch with Why / How / Related PR / Future plan.

Every patch module in this package defines ``PATCH = Patch(...)``.  The loader
(``vllm_padplugin.plugin``) applies the ones whose ``needed(env)`` is true, in the
order of ``vllm_padplugin.patches.ALL``, each at most once per process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Env:
    """What the loader knows when it decides which patches apply."""

    vllm_version: str   # vllm.__version__ ("0.30.0", "0.35.0.dev12+g1234", ...)
    device_type: str    # current_platform.device_type: "cuda", "cpu", "hpu", ...
    mode: str           # "native" | "backport" | "hpu-noop" | "passthrough"
    strict: bool        # PADPLUGIN_STRICT=1: drift raises instead of warning


@dataclass(frozen=True)
class Patch:
    name: str
    surface_keys: tuple[str, ...]   # keys of vllm_padplugin.surface.SURFACE it touches
    why: str
    how: str
    related_pr: str
    future_plan: str                # when it can be removed
    needed: Callable[[Env], bool]
    # Applies the patch; returns the "module.attr" sites it changed (for the report).
    apply: Callable[[Env], list[str]]


def cuda_backport_only(env: Env) -> bool:
    """The runner backports matter only where we mask: CUDA on a vLLM without upstream's fix."""
    return env.mode == "backport" and env.device_type == "cuda"


def apply_on_import(module_name: str, patch_module: Callable[[object], list[str]],
                    applied: list[str], what: str) -> Callable[[Env], list[str]]:
    """An ``apply`` that patches ``module_name`` when vLLM imports it (at once if it already is).

    Runner modules import CUDA-only pieces, so patches never import them themselves.
    ``applied`` collects the sites patched in this process (read by the report).
    A failure gives one warning (strict mode raises): vLLM keeps upstream behaviour.
    """

    def apply(env: Env) -> list[str]:
        import sys

        from vllm_padplugin.import_hooks import when_imported
        from vllm_padplugin.state import warn_once

        def hook(module) -> None:
            try:
                applied.extend(patch_module(module))
            except Exception as exc:
                if env.strict:
                    raise
                warn_once(f"{module_name}:drift", "vllm_padplugin: %s backport not applied: %s", what, exc)

        already = module_name in sys.modules
        when_imported(module_name, hook)  # runs now if already imported
        return list(applied) if already else [f"{module_name} (on import)"]

    return apply
