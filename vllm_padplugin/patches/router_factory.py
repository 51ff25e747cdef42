"""PATCH: route every MoE router build through our ``create_fused_moe_router``."""
from __future__ import annotations

import functools
import logging
import sys
import types
from typing import Any, Callable

from vllm_padplugin import binding_sites, state, surface
from vllm_padplugin.import_hooks import when_imported
from vllm_padplugin.marks import is_ours
from vllm_padplugin.patches.base import Env, Patch

# router_override (and routing, torch ops) is imported when the factory module is, not at load
FACTORY_MODULE = surface.get("router_factory").module
FACTORY_NAME = surface.get("router_factory").qualname

logger = logging.getLogger("vllm_padplugin")


def _foreign(value: Any) -> bool:
    """A factory replacement living outside vLLM (another plugin's), not a vLLM function
    that happens to share the name."""
    if not isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
        return False
    mod = getattr(value, "__module__", "") or ""
    return not (mod == "vllm" or mod.startswith("vllm."))


def install(module: types.ModuleType) -> list[str]:
    """Wrap the factory in ``module`` (router_factory) and every binding site; guard them."""
    from vllm_padplugin.router_override import is_upstream_factory, upstream_of, wrap_factory

    with state.LOCK:
        current = getattr(module, FACTORY_NAME)
        by_name = binding_sites.find_sites((current,), names=(FACTORY_NAME,))
        upstream = upstream_of(current, tuple(v for _, _, v in by_name))
        sites = binding_sites.find_sites((current, upstream), names=(FACTORY_NAME,))
        wrappers: dict[int, Callable] = {}
        done: list[str] = []
        for mod, attr, value in [(module, FACTORY_NAME, current), *sites]:
            if not (value is current or value is upstream or is_ours(value)
                    or (attr == FACTORY_NAME and (_foreign(value) or is_upstream_factory(upstream_of(value))))):
                continue
            if not is_ours(value):
                wrapper = wrappers.get(id(value))
                if wrapper is None:
                    wrapper = wrappers[id(value)] = wrap_factory(value, upstream)
                    if value is not upstream:
                        state.STATE.foreign_factories.append(_qual(value))
                done.append(binding_sites.rebind(mod, attr, wrapper))
            binding_sites.guard(mod, attr)

        def on_assign(mod: types.ModuleType, name: str, value: Any) -> Any:
            # Another plugin assigns its factory after us: use it there, wrapped.
            if is_ours(value) or not callable(value) or isinstance(value, type):
                return value
            wrapped = wrap_factory(value, upstream)
            with state.LOCK:
                state.STATE.foreign_factories.append(_qual(value))
                state.STATE.add_site(binding_sites.site_name(mod, name))
            return wrapped

        binding_sites.set_assign_hook(on_assign)
        state.STATE.factory_installed = True
    # Known binding sites are guarded even when mid-import (fused_moe.layer usually is right
    # now: its own ``from ... import`` writes its globals directly, a later assignment by
    # another plugin goes through the guard); not-yet-imported ones right after import.
    for modname in known_site_modules():
        mod = sys.modules.get(modname)
        if mod is not None:
            binding_sites.guard(mod, FACTORY_NAME)
        else:
            when_imported(modname, state.safe_hook(lambda m: binding_sites.guard(m, FACTORY_NAME)))
    return sorted(set(done))


# The registry's known binding sites (layer.py; step5 mega_moe since 0.33): one list, in surface.py.
def known_site_modules() -> tuple[str, ...]:
    """The known binding sites where the installed vLLM keeps them now (the layer module may
    move with or without the factory: ``relocate``)."""
    from vllm_padplugin import relocate

    return relocate.where("router_factory_binding_sites").sites


def _qual(f: Any) -> str:
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"


def _apply(env: Env) -> list[str]:
    from vllm_padplugin.platforms import _source_file

    from vllm_padplugin import relocate

    module = relocate.module_of("router_factory")   # the registry's path, or where it moved
    if module not in sys.modules and _source_file(module) is None:
        raise LookupError(
            f"{FACTORY_MODULE} not found in the installed vLLM {env.vllm_version} (removed, or moved "
            f"where no static search finds {FACTORY_NAME}): MoE routers are built without the plugin"
        )
    ran_now = when_imported(module, _install_hook)
    return list(state.STATE.binding_sites) if ran_now else []


def _install_hook(module: types.ModuleType) -> None:
    """``install`` that never breaks vLLM's import; a failure is this patch's failure (one
    warning, or none more when the drift check already warned about its cause)."""
    try:
        install(module)
    except Exception as exc:
        state.patch_failed(f"patch {PATCH.name}", exc)


PATCH = Patch(
    name="router_factory",
    surface_keys=("router_factory", "router_factory_binding_sites", "fused_moe_layer"),
    why="Every MoE layer builds its router through create_fused_moe_router; wrapping it is the "
    "one place to accept skip_padding on every vLLM and to mask routers upstream does not.",
    how="Wrap (never copy) the installed factory with upstream's signature (+skip_padding), rebind "
    "every vllm module attribute holding it, install lazily via a post-import hook, and guard "
    "the binding sites so a later foreign assignment is wrapped too.",
    related_pr="vLLM PR #56079 (skip_padding, vLLM 0.31)",
    future_plan="Keep while vLLM < 0.31 is supported or other plugins replace the factory; in native "
    "mode it only keeps signature parity.",
    needed=lambda env: True,  # every mode: parity (skip_padding accepted) is needed everywhere
    apply=_apply,
)
