"""The patch registry: ``ALL`` lists patch modules (in this package) in the order they apply.

To add a patch: write ``patches/<name>.py`` defining ``PATCH = Patch(...)`` (see
``patches.base``) and append ``"<name>"`` to ``ALL``.  The loader
(``vllm_padplugin.plugin``) calls ``apply_all(env)`` once per process: each patch
whose ``needed(env)`` is true is applied in order; a patch that fails logs ONE
warning naming it (or raises in strict mode) and the others still apply.
The router factory comes first: the runner backports only matter once routers mask.
"""
from __future__ import annotations

import importlib
import logging

from vllm_padplugin.patches.base import Env, Patch

logger = logging.getLogger("vllm_padplugin")

ALL: list[str] = [
    "router_factory",       # H1: factory override + binding sites + masking routers
    "legacy_runner_mask",   # H3: legacy GPU runner fills is_padding (vLLM 0.28-0.30)
    "dbo_mask",             # H3: legacy DBO micro-batch contexts carry the sliced mask
    "native_fast_mask",     # issue 10: 0.31+ upstream's two masked_fill -> our one launch
]


def load(name: str) -> Patch:
    return importlib.import_module(f"{__name__}.{name}").PATCH


def patches() -> list[Patch]:
    """Every patch in ``ALL`` whose module exists (a module not landed yet is skipped)."""
    out = []
    for name in ALL:
        try:
            out.append(load(name))
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            logger.debug("vllm_padplugin: patch module %s not present", name)
    return out


def apply_all(env: Env, on_error) -> tuple[list[str], list[str]]:
    """Apply needed patches in order; ``on_error(patch_name, exc)`` handles a failure.

    Returns (names of applied patches, "module.attr" sites they reported)."""
    applied: list[str] = []
    sites: list[str] = []
    for patch in patches():
        try:
            if not patch.needed(env):
                continue
            sites.extend(patch.apply(env))
            applied.append(patch.name)
        except Exception as exc:  # one patch failing leaves the others working
            on_error(f"patch {patch.name}", exc)
    return applied, sites
