"""Per-process record of what the plugin did, and the one place failures are recorded.

One module-level object, so the report (CLI, demo, report-dir files) shows the
same facts the hooks and the factory wrapper recorded in this process.

Failure recording lives here too (``fail``, ``patch_failed``, ``warn_once``), at the
bottom of the import graph: the loader, the import hooks, the patches and the factory
wrapper all import it, it imports none of them, so the load path reads top to bottom
(``tests/test_import_layers.py`` keeps it so).  Any exception inside the plugin becomes
ONE warning naming the cause and vLLM keeps upstream behaviour; ``PADPLUGIN_STRICT=1``
raises instead.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass, field


@dataclass
class PluginState:
    platform_hook_ran: bool = False
    general_hook_ran: bool = False
    installed: bool = False          # patch loop ran (once per process)
    factory_installed: bool = False  # the router factory is wrapped in this process
    mode: str | None = None
    device_type: str | None = None
    applied_patches: list[str] = field(default_factory=list)
    binding_sites: list[str] = field(default_factory=list)  # "module.attr" we rebound/wrapped
    foreign_factories: list[str] = field(default_factory=list)  # other plugins' factories we wrapped
    drift: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    factory_calls: int = 0
    routers_built: dict[str, int] = field(default_factory=dict)  # router class name -> count
    masked_routers: int = 0
    skip_padding_requested: int = 0

    def add_site(self, site: str) -> None:
        if site not in self.binding_sites:
            self.binding_sites.append(site)


STATE = PluginState()
LOCK = threading.RLock()
WARNED: set[str] = set()   # keys of the one-time warnings already given in this process


def warn_once(key: str, msg: str, *args) -> None:
    """Log ``msg`` once per process per ``key`` (a cause must never flood a serving log)."""
    if key not in WARNED:
        WARNED.add(key)
        logging.getLogger("vllm_padplugin").warning(msg, *args)


def strict() -> bool:
    """PADPLUGIN_STRICT=1: plugin problems raise instead of warning."""
    return os.environ.get("PADPLUGIN_STRICT", "0").strip().lower() in ("1", "true", "yes", "on")


STRICT_MARK = "__padplugin_strict__"
logger = logging.getLogger("vllm_padplugin")


def fail(where: str, exc: BaseException) -> None:
    """Record a failure of ``where``: one warning, vLLM continues (strict mode: raise).

    Strict mode's error is raised once and passed up unchanged by the outer hooks
    (not re-wrapped into a nested message)."""
    if getattr(exc, STRICT_MARK, False):
        raise exc
    msg = f"{where} failed ({type(exc).__name__}: {exc})"
    with LOCK:
        STATE.errors.append(msg)
    if strict():
        err = RuntimeError(f"vllm_padplugin: {msg} [PADPLUGIN_STRICT=1]")
        setattr(err, STRICT_MARK, True)
        raise err from exc
    logger.warning("vllm_padplugin: %s; vLLM continues with upstream behaviour", msg)


def patch_failed(where: str, exc: BaseException) -> None:
    """A patch failed.  When the drift check already warned about its cause (a breaking
    finding on one of the patch's surface keys) the failure is recorded in the report but
    not warned about again: one cause, one warning."""
    # The failed patch's module is imported already (it ran): read its keys from there, so the
    # bottom layer never imports the patches.
    mod = sys.modules.get(f"vllm_padplugin.patches.{where.removeprefix('patch ')}")
    try:
        keys = set(mod.PATCH.surface_keys) if mod is not None else set()
    except Exception:
        keys = set()
    with LOCK:
        warned = [d for d in STATE.drift if d.get("severity") == "breaking" and d.get("key") in keys]
    if not warned or strict():
        fail(where, exc)
        return
    msg = f"{where} failed ({type(exc).__name__}: {exc})"
    with LOCK:
        STATE.errors.append(msg)
    logger.info("vllm_padplugin: %s (cause warned above: %s); vLLM continues with upstream behaviour",
                msg, warned[0].get("kind"))


def safe_hook(fn):
    """A post-import callback that can never break vLLM's import (one warning; strict raises)."""

    def hook(module) -> None:
        try:
            fn(module)
        except Exception as exc:
            fail(f"post-import hook for {getattr(module, '__name__', module)}", exc)

    return hook
