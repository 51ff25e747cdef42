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
