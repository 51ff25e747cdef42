"""What the drift checks need to know about one vLLM, behind one small interface.

``StaticView`` answers from source text (a ``source.Tree``: directory or git revision);
``vllm_padplugin.shim.RuntimeView`` answers the same questions from the imported vLLM.
The drift classes in ``checks`` only talk to a view, so static and runtime share them.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable

from .sigdiff import Param
from .source import Tree, decorator_names, params_of


@dataclass
class SymInfo:
    kind: str                      # function | class | method | property | field | attr | module
    _params: list[Param] | None = None   # functions/methods; classes: __init__ (self dropped)
    readonly: bool = False         # property without setter
    where: str = ""                # module actually holding it (after re-exports)
    line: int = 0
    loader: Callable[[], list[Param] | None] | None = None   # parse only if params are asked for

    @property
    def params(self) -> list[Param] | None:
        if self.loader is not None:
            self._params, self.loader = self.loader(), None
        return self._params


class StaticView:
    def __init__(self, tree: Tree):
        self.tree = tree

    # -- presence --------------------------------------------------------
    def has_module(self, module: str) -> bool:
        return self.tree.module_exists(module)

    def lazy_module(self, module: str) -> bool:
        m = self.tree.module(module)
        return bool(m and m.lazy_getattr)

    def defined_here(self, module: str, name: str) -> bool:
        m = self.tree.module(module)
        return bool(m and (name in m.defs or name in m.imports or name in m.assigns))

    def lookup(self, module: str, qualname: str) -> SymInfo | None:
        kind = self.tree.quick_top_level(module, qualname)
        if kind is not None:     # presence from the text; the file is parsed only for params
            return SymInfo(kind, where=module, loader=lambda: self._full(module, qualname).params)
        return self._full(module, qualname)

    def _full(self, module: str, qualname: str) -> SymInfo | None:
        r = self.tree.resolve(module, qualname)
        if r is None:
            return None
        node, where = r.node, r.module.name
        line = getattr(node, "lineno", 0)
        if node is None:
            return SymInfo("module", where=where)
        if isinstance(node, ast.ClassDef):
            init = self.tree.class_member(node, "__init__", r.module)
            ps = params_of(init)[1:] if isinstance(init, ast.FunctionDef) else None
            return SymInfo("class", ps, where=where, line=line)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decos = decorator_names(node)
            if r.owner is not None and ("property" in decos or "cached_property" in decos):
                has_setter = "cached_property" in decos or any(
                    isinstance(s, ast.FunctionDef) and s.name == node.name and "setter" in decorator_names(s)
                    for s in ast.walk(r.owner))
                return SymInfo("property", readonly=not has_setter, where=where, line=line)
            ps = params_of(node)
            if r.owner is not None and "staticmethod" not in decos:
                ps = ps[1:]
            return SymInfo("method" if r.owner is not None else "function", ps, where=where, line=line)
        return SymInfo("field" if r.owner is not None else "attr", where=where, line=line)

    def abstract_methods(self, module: str, qualname: str) -> set[str] | None:
        r = self.tree.resolve(module, qualname)
        if r is None or not isinstance(r.node, ast.ClassDef):
            return None
        return self.tree.abstract_methods(r.node, r.module)

    # -- calls -----------------------------------------------------------
    def call_kwargs(self, module: str, qualname: str, callee: str) -> list[tuple[int, set[str], bool]] | None:
        """Calls to ``callee`` inside ``module:qualname``: (line, keyword names, has **kw)."""
        r = self.tree.resolve(module, qualname)
        if r is None or r.node is None:
            return None
        return _calls(r.node, callee)

    def callers(self, module: str, name: str) -> dict[str, list[tuple[int, set[str], bool]]]:
        """Upstream call sites of ``module:name``: defining module + every binding site."""
        out = {}
        for site in [module] + self.binding_sites(module, name):
            m = self.tree.module(site)
            if m is not None:
                calls = _calls(m.tree, name)
                if calls:
                    out[site] = calls
        return out

    def binding_sites(self, module: str, name: str) -> list[str]:
        return self.tree.importers(module, name)

    def find_definitions(self, name: str) -> list[str]:
        return self.tree.find_definitions(name)

    # -- env -------------------------------------------------------------
    def env_default(self, name: str, module: str = "vllm.envs") -> tuple[bool, str | None]:
        """(present, default text) of ``name`` in ``module``'s (``vllm/envs.py``) environment_variables."""
        from .source import module_paths

        text = None
        for rel in module_paths(module):
            text = self.tree._text(rel)
            if text is not None:
                break
        if text is None:
            return False, None
        if name not in text:
            return False, None
        fast = _env_entry(text, name)     # envs.py is large: parse only the dict entry
        if fast is not None:
            return True, _getenv_default(fast, name)
        m = self.tree.module(module)
        if m is None:
            return False, None
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if isinstance(k, ast.Constant) and k.value == name:
                        return True, _getenv_default(v, name)
        return False, None


def _callee_name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _calls(node: ast.AST, callee: str) -> list[tuple[int, set[str], bool]]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and _callee_name(n.func) == callee:
            kws = {k.arg for k in n.keywords if k.arg}
            out.append((n.lineno, kws, any(k.arg is None for k in n.keywords)))
    return out


def _env_entry(text: str, name: str) -> ast.AST | None:
    """The value of ``"NAME": <value>,`` in a dict literal, parsed from the few lines it spans."""
    lines = text.splitlines()
    key = re.compile(rf"""^\s*["']{re.escape(name)}["']\s*:""")
    for i, line in enumerate(lines):
        if key.match(line):
            for j in range(i + 1, min(i + 40, len(lines)) + 1):
                chunk = "\n".join(lines[i:j]).rstrip().rstrip(",")
                try:
                    d = ast.parse("{\n" + chunk + "\n}", mode="eval").body
                except SyntaxError:
                    continue
                if isinstance(d, ast.Dict) and len(d.keys) == 1:
                    return d.values[0]
    return None


def _getenv_default(node: ast.AST, name: str) -> str | None:
    for n in ast.walk(node):
        if (isinstance(n, ast.Call) and _callee_name(n.func) in ("getenv", "get") and len(n.args) >= 2
                and isinstance(n.args[0], ast.Constant) and n.args[0].value == name):
            d = n.args[1]
            return str(d.value) if isinstance(d, ast.Constant) else ast.unparse(d)
    return None
