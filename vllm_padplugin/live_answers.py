"""What the imported vLLM says about a symbol, as plain JSON-able values (no compat import).

The runtime drift check (``runtime_view.RuntimeView``) asks these functions first; each
returns ``STATIC`` when the live objects cannot tell (module not imported, an instance
attribute only the source shows) and the view then reads the installed files.  Because the
answers are plain data, ``shim`` can record the live answers a check used and, in a later
process, re-ask exactly these questions (cheap ``inspect`` calls, nothing parsed or
imported) to decide whether the cached findings still hold: same files (stamps) and same
live answers give the same findings, the check being a function of its answers.

Answer shapes: ``lookup`` -> ``None`` (absent) or ``[kind, params | None, readonly, where]``
with params ``[[name, kind, has_default, default_repr], ...]``; ``abstract_methods`` ->
sorted list; ``binding_sites`` -> sorted list (always live); the others -> bool.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import sys

STATIC = "<static>"

_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "POSITIONAL_ONLY",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "POSITIONAL_OR_KEYWORD",
    inspect.Parameter.VAR_POSITIONAL: "VAR_POSITIONAL",
    inspect.Parameter.KEYWORD_ONLY: "KEYWORD_ONLY",
    inspect.Parameter.VAR_KEYWORD: "VAR_KEYWORD",
}


def params(obj) -> list | None:
    """``inspect.signature`` as ``[[name, kind, has_default, default_repr], ...]`` (None: not introspectable)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        has = p.default is not inspect.Parameter.empty
        out.append([p.name, _KINDS[p.kind], has, repr(p.default) if has else None])
    return out


def _drop_self(ps: list | None) -> list:
    ps = ps or []
    return ps[1:] if ps and ps[0][1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD") else ps


def has_module(module: str):
    return True if module in sys.modules else STATIC


def lazy_module(module: str):
    m = sys.modules.get(module)
    return STATIC if m is None else "__getattr__" in vars(m)


def defined_here(module: str, name: str):
    m = sys.modules.get(module)
    return STATIC if m is None else name in vars(m)


def lookup(module: str, qualname: str):
    m = sys.modules.get(module)
    if m is None or not qualname:
        return STATIC
    head, _, rest = qualname.partition(".")
    if head not in vars(m) and "__getattr__" in vars(m):
        return None          # only a lazy __getattr__ would answer: not patchable here
    obj = getattr(m, head, None)
    if obj is None:
        return STATIC if head not in vars(m) else None
    if not rest:
        if inspect.isclass(obj):
            return ["class", params(obj), False, obj.__module__]
        if inspect.ismodule(obj):
            return ["module", None, False, obj.__name__]
        if callable(obj):
            return ["function", params(obj), False, getattr(obj, "__module__", module)]
        return ["attr", None, False, module]
    if not inspect.isclass(obj):
        return None
    for klass in obj.__mro__:
        if rest in vars(klass):
            attr = vars(klass)[rest]
            if isinstance(attr, property):
                return ["property", None, attr.fset is None, klass.__module__]
            if isinstance(attr, functools.cached_property):
                return ["property", None, False, klass.__module__]
            if isinstance(attr, staticmethod):
                return ["method", params(attr.__func__), False, klass.__module__]
            if callable(attr):
                return ["method", _drop_self(params(attr)), False, klass.__module__]
            return ["field", None, False, klass.__module__]
    if dataclasses.is_dataclass(obj) and rest in {f.name for f in dataclasses.fields(obj)}:
        return ["field", None, False, obj.__module__]
    if any(rest in getattr(k, "__annotations__", {}) for k in obj.__mro__):
        return ["field", None, False, obj.__module__]
    return STATIC   # instance attributes set in __init__ are only visible in the source


def abstract_methods(module: str, qualname: str):
    m = sys.modules.get(module)
    obj = getattr(m, qualname, None) if m is not None and "." not in qualname else None
    if inspect.isclass(obj):
        return sorted(getattr(obj, "__abstractmethods__", ()))
    return STATIC


def binding_sites(module: str, name: str) -> list[str]:
    """Imported vLLM modules holding ``name`` (not yet imported ones: the loader's import hook);
    not those holding a same-named function another vLLM module defines (``importers``' rule)."""
    out = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or mod_name == module or not mod_name.startswith("vllm."):
            continue
        try:
            if name in vars(mod) and not _other_vllm_definition(vars(mod)[name], module):
                out.append(mod_name)
        except TypeError:
            continue
    return sorted(out)


def _other_vllm_definition(value, module: str) -> bool:
    """``value`` is a function (wrappers unwrapped) defined in a vLLM module other than ``module``."""
    try:
        func = inspect.unwrap(value)
    except ValueError:
        return False
    home = getattr(func, "__module__", None) if inspect.isfunction(func) else None
    return isinstance(home, str) and (home == "vllm" or home.startswith("vllm.")) and home != module


ASK = {f.__name__: f for f in (has_module, lazy_module, defined_here, lookup, abstract_methods, binding_sites)}


def replay(answers: list) -> bool:
    """Whether every recorded ``[question, args, answer]`` is answered the same way now."""
    try:
        return all(ASK[q](*args) == ans for q, args, ans in answers)
    except Exception:
        return False
