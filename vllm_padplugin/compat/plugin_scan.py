"""Discover another plugin's vLLM surface from its source, then run the same drift classes.

Found statically (``ast``, the plugin is never imported): functions it assigns into vLLM
modules (``mod.f = g`` / ``setattr(mod, "f", g)``), classes deriving from vLLM classes,
attributes it assigns on vLLM classes (also ``self.x = ...`` inside such subclasses),
vLLM names it imports, vLLM functions it calls (keywords passed), ``VLLM_*`` env vars it reads.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..surface import Finding
from . import checks
from .sigdiff import VAR_KEYWORD, Param
from .source import SourceError, params_of


@dataclass
class Use:
    what: str            # import | replace | subclass | assign | call | env
    target: str          # dotted vLLM path as written (module part resolved later)
    where: str           # plugin file:line
    name: str = ""       # plugin-side name (function/class)
    params: list[Param] | None = None     # replace: the replacement's signature (None: unknown)
    methods: set[str] = field(default_factory=set)   # subclass: implemented methods
    kwargs: set[str] = field(default_factory=set)    # call: keywords passed
    npos: int = 0
    star: bool = False
    default: str | None = None           # env: default the plugin assumes


def _py_files(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in (
            "__pycache__", "build", "dist", "tests", "test", "node_modules", ".venv", "venv"))
        for f in sorted(filenames):
            if f.endswith(".py"):
                yield Path(dirpath) / f


class _FileScan(ast.NodeVisitor):
    def __init__(self, rel: str, uses: list[Use]):
        self.rel, self.uses = rel, uses
        self.alias: dict[str, str] = {}      # local name -> dotted vllm path
        self.funcs: dict[str, ast.AST] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.cls_stack: list[tuple[ast.ClassDef, list[str]]] = []   # class, its vllm bases

    def w(self, node) -> str:
        return f"{self.rel}:{getattr(node, 'lineno', 0)}"

    def dotted(self, node) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.alias:
            return ".".join([self.alias[node.id]] + parts[::-1])
        return None

    # imports
    def visit_Import(self, node):
        for a in node.names:
            if a.name == "vllm" or a.name.startswith("vllm."):
                if a.asname:
                    self.alias[a.asname] = a.name
                else:
                    self.alias["vllm"] = "vllm"
                self.uses.append(Use("import", a.name, self.w(node)))

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        if node.level == 0 and (mod == "vllm" or mod.startswith("vllm.")):
            for a in node.names:
                self.alias[a.asname or a.name] = f"{mod}.{a.name}"
                self.uses.append(Use("import", f"{mod}.{a.name}", self.w(node)))

    # definitions
    def visit_FunctionDef(self, node):
        self.funcs.setdefault(node.name, node)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.classes[node.name] = node
        vbases = [d for d in (self.dotted(b) for b in node.bases) if d]
        for b in vbases:
            methods = {s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
            self.uses.append(Use("subclass", b, self.w(node), node.name, methods=methods))
        self.cls_stack.append((node, vbases))
        self.generic_visit(node)
        self.cls_stack.pop()

    # assignments
    def _assign(self, target, value, node):
        if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                and target.value.id == "self" and self.cls_stack and self.cls_stack[-1][1]):
            for b in self.cls_stack[-1][1]:
                self.uses.append(Use("assign", f"{b}.{target.attr}", self.w(node), self.cls_stack[-1][0].name))
            return
        if not isinstance(target, ast.Attribute):
            return
        obj = self.dotted(target.value)
        if obj is None:
            return
        params = None
        if isinstance(value, ast.Name) and value.id in self.funcs:
            params = params_of(self.funcs[value.id])
        elif isinstance(value, ast.Lambda):
            params = params_of(value)
        name = value.id if isinstance(value, ast.Name) else ast.unparse(value)[:40]
        self.uses.append(Use("replace", f"{obj}.{target.attr}", self.w(node), name, params=params))

    def visit_Assign(self, node):
        for t in node.targets:
            self._assign(t, node.value, node)
        self.generic_visit(node)

    def visit_Call(self, node):
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id == "setattr" and len(node.args) == 3 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            self._assign(ast.Attribute(value=node.args[0], attr=node.args[1].value), node.args[2], node)
        elif self._env_call(node):
            pass
        else:
            d = self.dotted(fn)
            if d:
                self.uses.append(Use("call", d, self.w(node), kwargs={k.arg for k in node.keywords if k.arg},
                                     npos=len(node.args),
                                     star=any(k.arg is None for k in node.keywords)
                                     or any(isinstance(a, ast.Starred) for a in node.args)))
        self.generic_visit(node)

    def _env_call(self, node) -> bool:
        fn = ast.unparse(node.func)
        if fn in ("os.getenv", "os.environ.get", "getenv", "environ.get") and node.args \
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("VLLM_"):
            d = node.args[1] if len(node.args) > 1 else None
            default = str(d.value) if isinstance(d, ast.Constant) else None
            self.uses.append(Use("env", node.args[0].value, self.w(node), name="getenv", default=default))
            return True
        return False

    def visit_Attribute(self, node):
        d = self.dotted(node)
        if d and d.startswith("vllm.envs.VLLM_"):
            self.uses.append(Use("env", d.rsplit(".", 1)[1], self.w(node)))
        elif d and isinstance(node.ctx, ast.Load):
            self.uses.append(Use("import", d, self.w(node)))   # a read of a vLLM name
            return    # inner parts of the chain are prefixes of this one
        self.generic_visit(node)

    def visit_For(self, node):
        """``for m in (mod_a, mod_b): m.f = g``: the loop body runs once per vLLM module alias."""
        if (isinstance(node.target, ast.Name) and isinstance(node.iter, (ast.Tuple, ast.List))
                and node.iter.elts and all(isinstance(e, ast.Name) and e.id in self.alias
                                           for e in node.iter.elts)):
            saved = self.alias.get(node.target.id)
            for e in node.iter.elts:
                self.alias[node.target.id] = self.alias[e.id]
                for st in node.body:
                    self.visit(st)
            if saved is None:
                self.alias.pop(node.target.id, None)
            else:
                self.alias[node.target.id] = saved
            return
        self.generic_visit(node)


def scan_plugin(root: str | os.PathLike) -> list[Use]:
    """Every vLLM use in the plugin's Python files (tests and build dirs skipped)."""
    root = Path(root).expanduser()
    if not root.exists():
        raise SourceError(f"plugin source path does not exist: {root}")
    files = [root] if root.is_file() else list(_py_files(root))
    if not files:
        raise SourceError(f"no Python files under plugin source {root}")
    uses: list[Use] = []
    for f in files:
        rel = str(f.relative_to(root)) if f != root else f.name
        try:
            tree = ast.parse(f.read_text(encoding="utf-8", errors="replace"), filename=str(f))
        except SyntaxError as e:
            raise SourceError(f"syntax error in plugin file {f}:{e.lineno}: {e.msg}") from None
        s = _FileScan(rel, uses)
        # first pass for function defs so assignments later in the file know them
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                s.funcs.setdefault(n.name, n)
        s.visit(tree)
    return uses


def split(view, dotted: str) -> tuple[str, str]:
    """Longest module prefix of ``dotted`` in the tree, and the rest as qualname."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        mod = ".".join(parts[:i])
        if view.has_module(mod):
            return mod, ".".join(parts[i:])
    # module gone: assume the last part is the symbol (module path as written)
    return ".".join(parts[:-1]) or dotted, parts[-1] if len(parts) > 1 else ""


def check_plugin(view, uses: list[Use], plugin: str = "the plugin") -> list[Finding]:
    out: list[Finding] = []
    seen: set[tuple] = set()
    replaced: dict[tuple[str, str], list[Use]] = {}
    rebinds: dict[tuple[str, str], set[str]] = {}

    def add(fs, where):
        for f in fs:
            i = (f.kind, f.symbol, str(f.extra.get("item", "")))
            if i not in seen:
                seen.add(i)
                f.extra.setdefault("plugin_site", where)
                out.append(f)

    for u in uses:
        if u.what == "env":
            if u.name == "getenv":
                # read from the environment by the plugin itself: only a default that disagrees
                # with vLLM's matters (a VLLM_* name vLLM never declared is the plugin's own)
                if view.env_default(u.target)[0]:
                    add(checks.check_env(view, u.target, u.default), u.where)
            else:                # through vllm.envs: gone upstream = AttributeError
                add(checks.check_env(view, u.target, None), u.where)
            continue
        if u.what == "import" and u.target == "vllm":
            continue
        mod, qual = split(view, u.target)
        use = {"replace": "wrap", "assign": "assign", "subclass": "subclass"}.get(u.what, "read")
        if u.what == "assign":
            cls = qual.rsplit(".", 1)[0] if "." in qual else qual
            fs, info = checks.check_presence(view, mod, cls, use="read")
            add(fs, u.where)
            if info is not None:
                add(checks.check_assign(view, mod, qual, who=u.name or plugin), u.where)
            continue
        fs, info = checks.check_presence(view, mod, qual, use=use)
        add(fs, u.where)
        if info is None or info is True:
            continue
        if u.what == "subclass":
            add(checks.check_abstract(view, mod, qual, u.methods, who=u.name), u.where)
        elif u.what == "call" and info.params is not None and not u.star:
            add(checks.check_params(f"{mod}.{qual}", info.params, sorted(u.kwargs)), u.where)
            consumed = {p.name for p in info.params[: u.npos]}
            if not any(p.kind == VAR_KEYWORD for p in info.params):
                add(checks.check_required(f"{mod}.{qual}", info.params, u.kwargs | consumed), u.where)
        elif u.what == "replace" and info.kind == "function":
            home = info.where or mod
            name = qual.rsplit(".", 1)[-1]
            replaced.setdefault((home, name), []).append(u)
            rebinds.setdefault((home, name), set()).add(mod)

    for (home, name), us in replaced.items():
        for u in us:
            if u.params is not None:
                add(checks.check_override(view, home, name, u.params, who=u.name), u.where)
                break
        add(checks.check_binding_sites(view, home, name, rebinds[(home, name)] | {home}, handled=False),
            us[0].where)
    return out
