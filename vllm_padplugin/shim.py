"""Runtime drift shim: check the plugin's registry against the vLLM imported in this process.

``check_loaded_vllm()`` runs the same drift classes as ``vllm-padplugin compat``
(``compat.checks.check_surface``) through a ``RuntimeView``: for modules already imported
it asks the live objects (``inspect``: signatures, properties, abstract methods, module
``__getattr__``); for what only the source can tell (calls inside a function, the env
defaults in ``vllm/envs.py``) and for modules not imported yet, it reads the installed
files statically, so checking never imports vLLM modules (no import side effects).

``emit(findings, strict)`` logs one line per finding on logger ``vllm_padplugin``
(WARNING for breaking, INFO for info), or in strict mode raises one ``DriftError`` that
lists every breaking finding.  Never silent, never fatal outside strict mode.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
import logging
import sys
from pathlib import Path

from .compat.sigdiff import (KEYWORD_ONLY, POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_KEYWORD,
                             VAR_POSITIONAL, Param, drop_self)
from .compat.source import DirReader, Tree
from .compat.view import StaticView, SymInfo
from .surface import SURFACE, Finding

logger = logging.getLogger("vllm_padplugin")

_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: POSITIONAL_OR_KEYWORD,
    inspect.Parameter.VAR_POSITIONAL: VAR_POSITIONAL,
    inspect.Parameter.KEYWORD_ONLY: KEYWORD_ONLY,
    inspect.Parameter.VAR_KEYWORD: VAR_KEYWORD,
}


class DriftError(RuntimeError):
    """Strict mode (PADPLUGIN_STRICT=1): breaking drift found at load."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        lines = [f"{len(findings)} breaking vLLM drift(s) for vllm_padplugin:"]
        lines += [f"  - {f.kind}: {f.symbol}: {f.detail} (fix: {f.fix})" for f in findings]
        super().__init__("\n".join(lines))


def runtime_params(obj) -> list[Param] | None:
    """``inspect.signature`` as the shared ``Param`` model (None if not introspectable)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        has = p.default is not inspect.Parameter.empty
        out.append(Param(p.name, _KINDS[p.kind], has, repr(p.default) if has else None))
    return out


def vllm_root() -> Path | None:
    """Directory holding the ``vllm`` package (of the imported one if imported)."""
    mod = sys.modules.get("vllm")
    if mod is not None and getattr(mod, "__file__", None):
        return Path(mod.__file__).resolve().parent.parent
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


class RuntimeView(StaticView):
    """Live objects where imported, installed source text otherwise."""

    def has_module(self, module: str) -> bool:
        return module in sys.modules or super().has_module(module)

    def lazy_module(self, module: str) -> bool:
        m = sys.modules.get(module)
        if m is None:
            return super().lazy_module(module)
        return "__getattr__" in vars(m)

    def defined_here(self, module: str, name: str) -> bool:
        m = sys.modules.get(module)
        return name in vars(m) if m is not None else super().defined_here(module, name)

    def upstream_lookup(self, module: str, qualname: str) -> SymInfo | None:
        """What the installed source defines (our own wrappers may sit on the live attribute)."""
        return super().lookup(module, qualname)

    def lookup(self, module: str, qualname: str) -> SymInfo | None:
        m = sys.modules.get(module)
        if m is None or not qualname:
            return super().lookup(module, qualname)
        head, _, rest = qualname.partition(".")
        if head not in vars(m) and "__getattr__" in vars(m):
            return None          # only a lazy __getattr__ would answer: not patchable here
        obj = getattr(m, head, None)
        if obj is None:
            return super().lookup(module, qualname) if head not in vars(m) else None
        if not rest:
            if inspect.isclass(obj):
                return SymInfo("class", runtime_params(obj), where=obj.__module__)
            if inspect.ismodule(obj):
                return SymInfo("module", where=obj.__name__)
            if callable(obj):
                return SymInfo("function", runtime_params(obj), where=getattr(obj, "__module__", module))
            return SymInfo("attr", where=module)
        if not inspect.isclass(obj):
            return None
        for klass in obj.__mro__:
            if rest in vars(klass):
                attr = vars(klass)[rest]
                if isinstance(attr, property):
                    return SymInfo("property", readonly=attr.fset is None, where=klass.__module__)
                if isinstance(attr, functools.cached_property):
                    return SymInfo("property", readonly=False, where=klass.__module__)
                if isinstance(attr, staticmethod):
                    return SymInfo("method", runtime_params(attr.__func__), where=klass.__module__)
                if callable(attr):
                    return SymInfo("method", drop_self(runtime_params(attr) or []), where=klass.__module__)
                return SymInfo("field", where=klass.__module__)
        if dataclasses.is_dataclass(obj) and rest in {f.name for f in dataclasses.fields(obj)}:
            return SymInfo("field", where=obj.__module__)
        if any(rest in getattr(k, "__annotations__", {}) for k in obj.__mro__):
            return SymInfo("field", where=obj.__module__)
        # instance attributes set in __init__ are only visible in the source
        return super().lookup(module, qualname)

    def abstract_methods(self, module: str, qualname: str) -> set[str] | None:
        m = sys.modules.get(module)
        obj = getattr(m, qualname, None) if m is not None and "." not in qualname else None
        if inspect.isclass(obj):
            return set(getattr(obj, "__abstractmethods__", ()))
        return super().abstract_methods(module, qualname)

    def binding_sites(self, module: str, name: str) -> list[str]:
        """Imported vLLM modules holding ``name`` (not yet imported ones: the loader's import hook)."""
        out = []
        for mod_name, mod in list(sys.modules.items()):
            if mod is None or mod_name == module or not mod_name.startswith("vllm."):
                continue
            try:
                if name in vars(mod):
                    out.append(mod_name)
            except TypeError:
                continue
        return sorted(out)


def check_loaded_vllm(surface=SURFACE) -> list[Finding]:
    """Drift of ``surface`` against this process's vLLM.  Never raises: a failure of the check
    itself comes back as one breaking finding (so strict mode still stops)."""
    try:
        from .compat.checks import check_surface

        root = vllm_root()
        if root is None:
            return [Finding("vllm-missing", "vllm", "vLLM is not installed in this Python",
                            "breaking", "Install vLLM; the plugin only works beside it.")]
        view = RuntimeView(Tree(DirReader(root)))
        findings = check_surface(view, surface)
        for err in view.tree.errors:
            findings.append(Finding("source-unreadable", "vllm", f"installed vLLM file does not parse: {err}",
                                    "info", "Reinstall vLLM."))
        return findings
    except Exception as e:  # the shim must never take vLLM down
        return [Finding("check-failed", "vllm_padplugin.shim", f"drift check failed: {type(e).__name__}: {e}",
                        "breaking", "Report this to vllm_padplugin with the vLLM version.")]


def emit(findings: list[Finding], strict: bool) -> list[str]:
    """One log line per finding (WARNING breaking, INFO info); strict: one DriftError on breaking."""
    lines = []
    for f in findings:
        msg = f"vLLM drift [{f.severity}] {f.kind}: {f.symbol}: {f.detail}" + (f" Fix: {f.fix}" if f.fix else "")
        logger.log(logging.WARNING if f.severity == "breaking" else logging.INFO, msg)
        lines.append(msg)
    breaking = [f for f in findings if f.severity == "breaking"]
    if strict and breaking:
        raise DriftError(breaking)
    return lines
