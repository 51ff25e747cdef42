"""The runtime view of the drift check: live objects where imported, installed source otherwise.

Split from ``shim`` so that a plugin load answered from the per-install cache never imports
``compat.*`` (the static reader, the signature model): this module is imported only when
the check really runs.

The live answers come from ``live_answers`` (plain data); ``RuntimeView`` records every
question it asked there and the answer (``answers``), so ``shim`` can cache the findings
and later re-ask just those questions to see whether they still hold.
"""
from __future__ import annotations

from . import live_answers as live
from .compat.sigdiff import Param
from .compat.view import StaticView, SymInfo

def runtime_params(obj) -> list[Param] | None:
    """``inspect.signature`` as the shared ``Param`` model (None if not introspectable)."""
    return _params(live.params(obj))


def _params(ps: list | None) -> list[Param] | None:
    return None if ps is None else [Param(*p) for p in ps]


class RuntimeView(StaticView):
    """Live objects where imported, installed source text otherwise."""

    def __init__(self, tree):
        super().__init__(tree)
        self.answers: dict[tuple, object] = {}   # (question, args) -> live answer (STATIC included)

    def _ask(self, question: str, *args):
        ans = live.ASK[question](*args)
        self.answers.setdefault((question, args), ans)
        return ans

    @property
    def live(self) -> bool:
        """Whether any answer came from a live object (not the installed files)."""
        return any(a != live.STATIC and not (q == "binding_sites" and a == [])
                   for (q, _), a in self.answers.items())

    def recorded(self) -> list:
        """The questions asked and their live answers, JSON-able (``live_answers.replay``)."""
        return [[q, list(args), a] for (q, args), a in self.answers.items()]

    def has_module(self, module: str) -> bool:
        ans = self._ask("has_module", module)
        return super().has_module(module) if ans == live.STATIC else ans

    def lazy_module(self, module: str) -> bool:
        ans = self._ask("lazy_module", module)
        return super().lazy_module(module) if ans == live.STATIC else ans

    def defined_here(self, module: str, name: str) -> bool:
        ans = self._ask("defined_here", module, name)
        return super().defined_here(module, name) if ans == live.STATIC else ans

    def upstream_lookup(self, module: str, qualname: str) -> SymInfo | None:
        """What the installed source defines (our own wrappers may sit on the live attribute)."""
        return super().lookup(module, qualname)

    def lookup(self, module: str, qualname: str) -> SymInfo | None:
        ans = self._ask("lookup", module, qualname)
        if ans == live.STATIC:
            return super().lookup(module, qualname)
        if ans is None:
            return None
        kind, ps, readonly, where = ans
        return SymInfo(kind, _params(ps), readonly=readonly, where=where)

    def abstract_methods(self, module: str, qualname: str) -> set[str] | None:
        ans = self._ask("abstract_methods", module, qualname)
        return super().abstract_methods(module, qualname) if ans == live.STATIC else set(ans)

    def binding_sites(self, module: str, name: str) -> list[str]:
        """Imported vLLM modules holding ``name`` (not yet imported ones: the loader's import hook)."""
        return list(self._ask("binding_sites", module, name))
