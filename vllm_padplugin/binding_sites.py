"""Rebind every module attribute that holds the router factory, and keep it rebound.

Why all three mechanisms below, and why no import-time text scan of vLLM:

1. ``rebind_loaded``: modules already imported did ``from ... import
   create_fused_moe_router`` and hold the original object; we scan the
   ``vllm*`` modules in ``sys.modules`` (identity + name match, ~ms).
2. ``import_hooks.when_imported``: when the factory's module is not imported yet, a
   post-import hook installs the wrapper right after ``router_factory`` executes,
   i.e. before ``fused_moe.layer`` (mid-import) and any later binding site (e.g.
   ``models/step5/nvidia/mega_moe.py`` in 0.33+) read the name.  Every module
   imported afterwards copies OUR wrapper, so new binding sites a later vLLM adds are
   covered without knowing their names, and the plugin never imports the heavy
   fused_moe package itself (seconds) at load.
3. ``guard``: another plugin (vllm-gaudi style) may assign its own factory into a
   binding site after us.  The module's class is swapped for a ModuleType subclass
   whose ``__setattr__`` wraps such an assignment, so the foreign factory is used
   exactly where it was assigned (as upstream would) but still accepts
   ``skip_padding`` and still masks.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Callable

from vllm_padplugin import state

GUARD_ATTR = "__padplugin_guarded__"
# Called as on_assign(module, name, value) -> value to store; set by the factory patch.
_on_assign: Callable[[types.ModuleType, str, Any], Any] | None = None


def vllm_modules() -> list[tuple[str, types.ModuleType]]:
    return [
        (n, m)
        for n, m in list(sys.modules.items())
        if (n == "vllm" or n.startswith("vllm.")) and isinstance(m, types.ModuleType)
    ]


def vllm_globals():
    """(module, attr, value) for every global of every loaded vllm module (dict-less ones skipped)."""
    for _, mod in vllm_modules():
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for attr, value in items:
            yield mod, attr, value


def find_sites(targets: tuple[Any, ...], names: tuple[str, ...] = ()) -> list[tuple[types.ModuleType, str, Any]]:
    """(module, attr, value) for every vllm module attribute that IS one of ``targets``,
    or is named in ``names`` and callable (a foreign factory assigned before us)."""
    ids = {id(t) for t in targets}
    return [
        (mod, attr, value)
        for mod, attr, value in vllm_globals()
        if id(value) in ids or (attr in names and callable(value) and not isinstance(value, type))
    ]


def site_name(mod: types.ModuleType, attr: str) -> str:
    return f"{mod.__name__}.{attr}"


def rebind(mod: types.ModuleType, attr: str, value: Any) -> str:
    """Set ``mod.attr = value`` (bypassing our own guard) and record the site."""
    types.ModuleType.__setattr__(mod, attr, value)
    site = site_name(mod, attr)
    with state.LOCK:
        state.STATE.add_site(site)
    return site


class _GuardedModule(types.ModuleType):
    """Module class that routes assignments to guarded names through ``_on_assign``."""

    def __setattr__(self, name: str, value: Any) -> None:
        guarded = self.__dict__.get(GUARD_ATTR, ())
        if name in guarded and _on_assign is not None:
            value = _on_assign(self, name, value)
        super().__setattr__(name, value)


def guard(mod: types.ModuleType, attr: str) -> bool:
    """Watch later assignments to ``mod.attr``.  Only plain modules are re-classed
    (a module with its own class, e.g. a lazy shim, is left alone: False)."""
    if type(mod) is types.ModuleType:
        try:
            mod.__class__ = _GuardedModule
        except TypeError:
            return False
    elif not isinstance(mod, _GuardedModule):
        return False
    names = set(mod.__dict__.get(GUARD_ATTR, ()))
    names.add(attr)
    types.ModuleType.__setattr__(mod, GUARD_ATTR, frozenset(names))
    return True


def set_assign_hook(hook: Callable[[types.ModuleType, str, Any], Any] | None) -> None:
    global _on_assign
    _on_assign = hook


def guard_holders(is_ours: Callable[[Any], bool]) -> list[str]:
    """Guard and record every vllm module attribute that holds one of our wrappers.

    Modules imported after installation copied our wrapper by ``from ... import``;
    they are binding sites too (report) and must be guarded against a later foreign
    assignment.  Run when the known site (fused_moe.layer) is imported and at the
    first router build; not per forward.
    """
    found = []
    for mod, attr in holders(is_ours):
        guard(mod, attr)
        site = site_name(mod, attr)
        with state.LOCK:
            state.STATE.add_site(site)
        found.append(site)
    return found


def holders(is_ours: Callable[[Any], bool]) -> list[tuple[types.ModuleType, str]]:
    """(module, attr) of every vllm module attribute holding one of our wrappers (read only)."""
    return [(mod, attr) for mod, attr, value in vllm_globals() if is_ours(value)]
