"""Which mode the plugin runs in, decided from vLLM's ``current_platform`` (lazily).

- ``native``: CUDA and upstream masks padded rows itself (vLLM 0.31+: the factory
  and ``GroupedTopKRouter.__init__`` both take ``skip_padding``) -> we only keep the
  override in signature parity and never mask twice;
- ``backport``: CUDA on a vLLM without that (0.28-0.30) -> we mask;
- ``hpu-noop``: vllm-gaudi's platform (device type "hpu"): ``skip_padding`` is
  accepted and ignored (HPU has no DeepEP v2);
- ``passthrough``: CPU, ROCm, XPU, TPU, anything else: upstream's routers untouched.

Only ``current_platform.device_type`` is consulted: never imports habana or deep_ep.
The upstream-capability check reads the installed sources with ``ast`` when the
fused_moe package is not imported yet (importing it costs seconds and must not
happen at plugin load), and inspects the live objects when it is.

``PADPLUGIN_FORCE_MODE`` (one of MODES) overrides the decision: a knob for
tests on CPU machines, not for production.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path

from vllm_padplugin import surface
from vllm_padplugin.compat_utils import has_argument, innermost, signature_from_source

logger = logging.getLogger("vllm_padplugin")

MODES = ("native", "backport", "hpu-noop", "passthrough")
FORCE_ENV = "PADPLUGIN_FORCE_MODE"
SKIP = "skip_padding"


def forced_mode() -> str | None:
    """The mode forced by ``PADPLUGIN_FORCE_MODE`` (tests only), or None."""
    raw = os.environ.get(FORCE_ENV, "").strip()
    if not raw:
        return None
    if raw not in MODES:
        raise ValueError(f"{FORCE_ENV}={raw!r} is not one of {', '.join(MODES)}")
    return raw


def mode_for(device_type: str, upstream_masks: bool) -> str:
    """Pure decision table (see module docstring)."""
    if device_type == "hpu":
        return "hpu-noop"
    if device_type == "cuda":
        return "native" if upstream_masks else "backport"
    return "passthrough"


def current_device_type() -> str:
    """``vllm.platforms.current_platform.device_type`` (resolves the platform: never
    call this from a platform hook)."""
    from vllm_padplugin import relocate

    mod = importlib.import_module(relocate.module_of("current_platform"))  # vllm.platforms, or its new home
    current_platform = getattr(mod, "current_platform")
    return str(getattr(current_platform, "device_type", "") or "")


def resolve(key: str) -> object | None:
    """The live object of surface entry ``key`` at its current home (``relocate``: imports its
    module), or None if gone."""
    from vllm_padplugin import relocate

    sym = relocate.where(key)
    try:
        obj: object = importlib.import_module(sym.module)
        for part in sym.qualname.split(".") if sym.qualname else ():
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError):
        return None


def _source_file(module: str) -> Path | None:
    """Where ``module`` of the installed vLLM lives, found without importing it."""
    vllm = sys.modules.get("vllm")
    if vllm is None or not getattr(vllm, "__file__", None):
        return None
    root = Path(vllm.__file__).parent
    rel = module.split(".")[1:]
    for cand in (root.joinpath(*rel).with_suffix(".py"), root.joinpath(*rel, "__init__.py")):
        if cand.is_file():
            return cand
    return None


def _accepts_from_source(key: str, qualname: str | None = None) -> bool | None:
    from vllm_padplugin import relocate

    sym = relocate.where(key)
    path = _source_file(sym.module)
    if path is None:
        return None
    try:
        sig = signature_from_source(path, qualname or sym.qualname)
    except (LookupError, SyntaxError, OSError, UnicodeDecodeError):
        return None
    return SKIP in sig.parameters


def upstream_masks_natively() -> bool:
    """True when the installed vLLM's own factory and GroupedTopKRouter take ``skip_padding``.

    Looks at upstream's factory (the innermost function behind any wrapper, ours
    or another plugin's), not at a replacement, so the answer is about vLLM.
    """
    from vllm_padplugin import relocate

    fac_mod = relocate.module_of("router_factory")
    if fac_mod in sys.modules:
        factory = resolve("router_factory")
        router = resolve("grouped_topk_router")
        if factory is None or router is None:
            return False
        return has_argument(innermost(factory), SKIP) and has_argument(router.__init__, SKIP)  # type: ignore[misc]
    gtr = surface.get("grouped_topk_router")
    fac = _accepts_from_source("router_factory")
    rtr = _accepts_from_source("grouped_topk_router", f"{gtr.qualname}.__init__")
    if fac is None or rtr is None:  # no readable sources: ask the live objects
        factory, router = resolve("router_factory"), resolve("grouped_topk_router")
        if factory is None or router is None:
            return False
        return has_argument(innermost(factory), SKIP) and has_argument(router.__init__, SKIP)  # type: ignore[misc]
    return fac and rtr


def decide_mode(device_type: str | None = None) -> str:
    """Mode for this process (see module docstring)."""
    forced = forced_mode()
    if forced:
        return forced
    dt = current_device_type() if device_type is None else device_type
    # Only CUDA needs the upstream check; it is skipped elsewhere to keep load cheap.
    return mode_for(dt, upstream_masks_natively() if dt == "cuda" else False)
