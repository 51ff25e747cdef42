"""Per-process record of what the plugin did: read by the report, written by the hooks.

One module-level object, so the report (CLI, demo, report-dir files) shows the
same facts the hooks and the factory wrapper recorded in this process.
"""
from __future__ import annotations

import logging
import os
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
