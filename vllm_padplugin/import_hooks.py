"""Post-import hooks: run a callback right after a module is imported, without importing it.

The plugin must never import vLLM's heavy modules (fused_moe, the GPU runners) at load,
yet patch them the moment vLLM imports them.  ``wrapt.register_post_import_hook`` does
that but importing wrapt costs 5-20 ms of every vLLM process's start-up, so the load path
uses this small finder instead (wrapt is imported only where a patch really wraps a
method, on CUDA).  Same contract as wrapt's: ``when_imported(name, hook)`` calls
``hook(module)`` at once when ``name`` is in ``sys.modules``, otherwise once, right after
the module's code has run (inside the importing statement, before the importer reads any
of its names); a module whose import fails keeps its hooks for the next attempt.

How: a finder first on ``sys.meta_path`` answers only for names with pending hooks.  It
asks the rest of the import system for the real spec and swaps the spec's loader for a
thin ``_HookLoader`` that gives the module its real loader back, runs it, then calls the
hooks.  Nothing else about the import changes.  Hooks are called outside the lock; a
hook's exception propagates (callers wrap their hooks in ``state.safe_hook``).
"""
from __future__ import annotations

import sys
import threading
from typing import Callable

Hook = Callable[[object], None]

_LOCK = threading.RLock()
_PENDING: dict[str, list[Hook]] = {}
_RESOLVING: set[tuple[int, str]] = set()   # (thread, name) while we look up the real spec


def when_imported(name: str, hook: Hook) -> bool:
    """Call ``hook(module)`` now if ``name`` is in ``sys.modules``, else right after its import.

    As with wrapt, a module still executing its own code (in ``sys.modules`` mid-import) is
    passed to the hook at once: its loader was chosen already, so there is no later moment
    to hook.  Returns True when the hook ran now on a fully imported module."""
    with _LOCK:
        mod = sys.modules.get(name)
        if mod is None:
            _PENDING.setdefault(name, []).append(hook)
            _install()
            return False
    hook(mod)
    return not _initializing(mod)


def pending(name: str) -> int:
    """How many hooks wait for ``name`` (tests, report)."""
    with _LOCK:
        return len(_PENDING.get(name, ()))


def _initializing(mod) -> bool:
    spec = getattr(mod, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _fire(name: str, module) -> None:
    with _LOCK:
        hooks = _PENDING.pop(name, [])
    module = sys.modules.get(name, module)
    for hook in hooks:
        hook(module)


class _HookLoader:
    """Delegates to the real loader; after ``exec_module`` calls the hooks of ``name``."""

    def __init__(self, loader, name: str):
        self._loader = loader
        self._name = name

    def __getattr__(self, attr):   # get_source, is_package, get_resource_reader, ...
        return getattr(self._loader, attr)

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module) -> None:
        # the module sees its real loader, as it would without us
        if getattr(module, "__loader__", None) is self:
            try:
                module.__loader__ = self._loader
            except AttributeError:
                pass
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        self._loader.exec_module(module)
        _fire(self._name, module)


class _Finder:
    """First on ``sys.meta_path``; answers only for modules with pending hooks."""

    def find_spec(self, fullname, path=None, target=None):
        key = (threading.get_ident(), fullname)
        with _LOCK:
            if fullname not in _PENDING or key in _RESOLVING:
                return None
            _RESOLVING.add(key)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or isinstance(finder, _Finder):
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            with _LOCK:
                _RESOLVING.discard(key)
        if spec is None:
            return None
        loader = spec.loader
        if loader is None or isinstance(loader, _HookLoader) or not hasattr(loader, "exec_module"):
            return spec   # namespace package / legacy loader: not hooked here
        spec.loader = _HookLoader(loader, fullname)
        return spec
