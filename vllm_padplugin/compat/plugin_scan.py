"""Discover another plugin's vLLM surface from its source, then run the same drift classes.

Found statically (``ast``, the plugin is never imported): functions and methods it installs
into vLLM (``mod.f = g``, ``Cls.meth = g``, ``setattr(obj, "f", g)``, also through a local
alias or a loop over modules), classes deriving from vLLM classes, attributes it assigns on
vLLM objects (``self.x`` in such subclasses, instances it builds, parameters annotated with a
vLLM class, and receivers whose name says which vLLM class they hold, e.g. ``model_executor``),
vLLM names it imports (module level, inside functions, inside ``try/except ImportError``),
vLLM functions it calls (keywords passed), ``VLLM_*`` env vars it reads.

Severity is about THIS plugin: ``breaking`` only where its code raises or silently stops
doing what it meant against that vLLM; everything else is ``info``.  Each breaking finding
carries the evidence a maintainer needs (``plugin_site``, ``upstream_site``, ``why``, ``fix``).
"""
from __future__ import annotations

import ast
import bisect
import gc
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..surface import Finding
from . import checks
from .sigdiff import VAR_KEYWORD, Param
from .source import SourceError, params_of

_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException", "AttributeError"}


@dataclass
class Use:
    what: str            # import | replace | subclass | assign | call | env | assign_named
    target: str          # dotted vLLM path as written (module part resolved later)
    where: str           # plugin file:line
    name: str = ""       # plugin-side name (function/class; assign_named: the receiver's name)
    params: list[Param] | None = None     # replace: the replacement's signature (None: unknown)
    methods: set[str] = field(default_factory=set)   # subclass: implemented methods
    kwargs: set[str] = field(default_factory=set)    # call: keywords passed
    npos: int = 0
    star: bool = False
    default: str | None = None           # env: default the plugin assumes
    module: str = ""                     # import: the module part exactly as written (from M import n)
    guarded: bool = False                # inside try/except ImportError (a fallback exists)
    local: bool = False                  # inside a function body (raises when that code runs)
    abstract: bool = False               # subclass: the plugin class itself is abstract
    is_method: bool = False              # replace: the replacement was written with ``self`` first


def _py_files(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in (
            "__pycache__", "build", "dist", "tests", "test", "node_modules", ".venv", "venv"))
        for f in sorted(filenames):
            if f.endswith(".py"):
                yield Path(dirpath) / f


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    """A handler that catches ImportError (or broader) and does not just re-raise."""
    t = handler.type
    names = set()
    if t is None:
        names.add("BaseException")
    else:
        for n in (t.elts if isinstance(t, ast.Tuple) else [t]):
            names.add(n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", ""))
    reraises = len(handler.body) == 1 and isinstance(handler.body[0], ast.Raise)
    return bool(names & _IMPORT_ERRORS) and not reraises


class _FileScan(ast.NodeVisitor):
    def __init__(self, rel: str, uses: list[Use]):
        self.rel, self.uses = rel, uses
        self.alias: dict[str, str] = {}      # local name -> dotted vllm path (module, class, function)
        self.inst: dict[str, str] = {}       # local name -> dotted vllm class it holds an instance of
        self.funcs: dict[str, ast.AST] = {}  # plugin functions ("f") and methods ("Cls.f")
        self.cls_stack: list[tuple[ast.ClassDef, list[str]]] = []   # class, its vllm bases
        self.own: dict[str, tuple[str, set[str]]] = {}   # plugin class without __init__ -> (vllm base, own fields)
        self.guard = 0                       # depth of try-blocks with an ImportError fallback
        self.depth = 0                       # function nesting depth
        self.typing = 0                      # inside ``if TYPE_CHECKING:``

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

    def instance_of(self, node) -> str | None:
        """The vLLM class whose instance ``node`` holds, when the plugin's code says so."""
        if isinstance(node, ast.Name) and node.id in self.inst:
            return self.inst[node.id]
        if (isinstance(node, ast.Name) and node.id == "self" and self.cls_stack and self.cls_stack[-1][1]):
            return self.cls_stack[-1][1][0]
        return None

    def use(self, *a, **kw) -> Use:
        u = Use(*a, guarded=self.guard > 0, local=self.depth > 0, **kw)
        if not self.typing:          # ``if TYPE_CHECKING:`` never runs: aliases only, no uses
            self.uses.append(u)
        return u

    def visit_If(self, node):
        t = node.test
        if (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
                isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"):
            self.typing += 1
            for st in node.body:
                self.visit(st)
            self.typing -= 1
            for st in node.orelse:
                self.visit(st)
            return
        self.generic_visit(node)

    # imports
    def visit_Import(self, node):
        for a in node.names:
            if a.name == "vllm" or a.name.startswith("vllm."):
                if a.asname:
                    self.alias[a.asname] = a.name
                else:
                    self.alias["vllm"] = "vllm"
                self.use("import", a.name, self.w(node), module=a.name)

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        if node.level == 0 and (mod == "vllm" or mod.startswith("vllm.")):
            for a in node.names:
                if a.name == "*":
                    continue
                self.alias[a.asname or a.name] = f"{mod}.{a.name}"
                self.use("import", f"{mod}.{a.name}", self.w(node), module=mod)

    def visit_Try(self, node):
        fallback = any(_catches_import_error(h) for h in node.handlers)
        self.guard += fallback
        for st in node.body:
            self.visit(st)
        self.guard -= fallback
        for part in (node.handlers, node.orelse, node.finalbody):
            for st in part:
                self.visit(st)

    visit_TryStar = visit_Try

    # definitions
    def visit_FunctionDef(self, node):
        saved = dict(self.inst)
        for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            d = self.dotted(a.annotation) if a.annotation is not None else None
            if d:
                self.inst[a.arg] = d
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        self.inst = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        vbases = [d for d in (self.dotted(b) for b in node.bases) if d]
        methods = {s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        abstract = any("abstract" in ast.unparse(d) for s in node.body
                       if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) for d in s.decorator_list)
        abstract = abstract or any(ast.unparse(b) in ("ABC", "abc.ABC") for b in node.bases)
        for b in vbases:
            self.use("subclass", b, self.w(node), node.name, methods=methods, abstract=abstract)
        if vbases and "__init__" not in methods:   # built with the vLLM base's constructor (dataclasses)
            self.own[node.name] = (vbases[0], {st.target.id for st in node.body if isinstance(st, ast.AnnAssign)
                                               and isinstance(st.target, ast.Name)})
        self.cls_stack.append((node, vbases))
        self.generic_visit(node)
        self.cls_stack.pop()

    # assignments
    def _replacement(self, value) -> tuple[list[Param] | None, bool]:
        node = None
        if isinstance(value, ast.Name):
            node = self.funcs.get(value.id)
        elif isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
            node = self.funcs.get(f"{value.value.id}.{value.attr}")
        elif isinstance(value, ast.Lambda):
            node = value
        if node is None:
            return None, False
        ps = params_of(node)
        return ps, bool(ps) and ps[0].name in ("self", "cls")

    def _assign(self, target, value, node):
        if not isinstance(target, ast.Attribute):
            return
        cls = self.instance_of(target.value)
        if cls is not None:      # an attribute of an instance of a vLLM class
            owner = self.cls_stack[-1][0].name if self.cls_stack else ""
            self.use("assign", f"{cls}.{target.attr}", self.w(node), owner)
            return
        obj = self.dotted(target.value)
        if obj is None:
            recv = target.value
            rname = recv.attr if isinstance(recv, ast.Attribute) else getattr(recv, "id", "")
            if rname and rname not in ("self", "cls"):
                self.use("assign_named", target.attr, self.w(node), rname)
            return
        params, is_method = self._replacement(value)
        name = value.id if isinstance(value, ast.Name) else ast.unparse(value)[:40]
        self.use("replace", f"{obj}.{target.attr}", self.w(node), name, params=params, is_method=is_method)

    def visit_Assign(self, node):
        for t in node.targets:
            self._assign(t, node.value, node)
            if isinstance(t, ast.Name):      # local alias of a vLLM object / instance of a vLLM class
                d = self.dotted(node.value)
                if d:
                    self.alias[t.id] = d
                elif isinstance(node.value, ast.Call) and self.dotted(node.value.func):
                    self.inst[t.id] = self.dotted(node.value.func)
        self.generic_visit(node)

    def visit_Call(self, node):
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id == "setattr" and len(node.args) == 3 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            self._assign(ast.Attribute(value=node.args[0], attr=node.args[1].value), node.args[2], node)
        elif self._env_call(node):
            pass
        elif isinstance(fn, ast.Name) and fn.id in self.own and fn.id not in self.alias:
            base, fields = self.own[fn.id]
            self.use("call", base, self.w(node), fn.id, kwargs={k.arg for k in node.keywords if k.arg} - fields,
                     npos=len(node.args), star=True if any(k.arg is None for k in node.keywords) else False)
        else:
            d = self.dotted(fn)
            if d:
                self.use("call", d, self.w(node), kwargs={k.arg for k in node.keywords if k.arg},
                         npos=len(node.args),
                         star=any(k.arg is None for k in node.keywords)
                         or any(isinstance(a, ast.Starred) for a in node.args))
        self.generic_visit(node)

    def _env_call(self, node) -> bool:
        fn = ast.unparse(node.func)
        if fn in ("os.getenv", "os.environ.get", "getenv", "environ.get") and node.args \
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("VLLM_"):
            d = node.args[1] if len(node.args) > 1 else None
            default = str(d.value) if isinstance(d, ast.Constant) else None
            self.use("env", node.args[0].value, self.w(node), name="getenv", default=default)
            return True
        return False

    def visit_Attribute(self, node):
        d = self.dotted(node)
        if d and d.startswith("vllm.envs.VLLM_"):
            self.use("env", d.rsplit(".", 1)[1], self.w(node))
        elif d and isinstance(node.ctx, ast.Load):
            self.use("import", d, self.w(node))   # a read of a vLLM name
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
        # first pass for function/method defs so assignments earlier in the file know them
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef):
                for st in n.body:
                    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        s.funcs.setdefault(f"{n.name}.{st.name}", st)
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


# -- evidence ------------------------------------------------------------------------

def upstream_site(view, module: str, qualname: str = "") -> str:
    """``vllm/x/y.py:LINE`` of a symbol in the checked tree ("" when unknown)."""
    tree = getattr(view, "tree", None)
    if tree is None:
        return ""
    try:
        r = tree.resolve(module, qualname) if qualname else None
    except Exception:   # noqa: BLE001 - evidence is best effort, never a failure
        r = None
    if r is not None:
        return f"{r.module.relpath}:{getattr(r.node, 'lineno', 1) if r.node is not None else 1}"
    m = tree.module(module) if module else None
    return f"{m.relpath}:1" if m is not None else ""


def _module_site(view, module: str) -> str:
    tree = getattr(view, "tree", None)
    m = tree.module(module) if tree is not None and module else None
    return m.relpath if m is not None else module


_PROP = re.compile(rb"@property\s*\n\s*(?:async\s+)?def\s+(\w+)")
_NESTING = (b"class ", b"class\t", b"def ", b"def\t", b"async ")


def _module_level_def(data: bytes, rx: re.Pattern) -> bool:
    """Text prefilter for find_definitions: does ``rx`` match (at a line start) a definition
    that is not nested in a class or function (module level, or inside a module-level
    if/try/with)?  Method names (``__init__``, ``forward``) are defined in thousands of vLLM
    files; parsing each of them to learn that none defines it at module level took ~30 s.
    Unsure cases (odd layout) count as module level: the parse that follows decides."""
    col0: list[int] | None = None
    for m in rx.finditer(data):
        pos = data.rfind(b"\n", 0, m.start()) + 1
        if data[pos:m.start()].strip(b" \t"):
            continue                       # not at the start of a line
        ind = m.start() - pos
        if ind and col0 is None:
            col0 = [c.start() for c in _COL0.finditer(data)]
        while ind:
            # the last line above with a smaller indent (the enclosing block opener) lies at or
            # after the last column-0 line above: search only from there
            i = bisect.bisect_left(col0, pos) - 1
            low = None
            for low in _low_indent(ind).finditer(data, col0[i] if i >= 0 else 0, pos):
                pass
            if low is None:
                break
            opener = data[low.end():low.end() + 6]
            if opener[:1] in (b")", b"]", b"}"):   # the close of a multi-line header: look higher
                pos = low.start()
                continue
            if opener.startswith(_NESTING):
                break                      # a method or a nested function: not module level
            pos, ind = low.start(), low.end() - low.start()
        else:
            return True
    return False


_LOW: dict[int, re.Pattern] = {}
_COL0 = re.compile(rb"^(?=[^ \t\r\n#])", re.M)


def _low_indent(ind: int) -> re.Pattern:
    if ind not in _LOW:
        _LOW[ind] = re.compile(rb"^[ \t]{0,%d}(?=[^ \t\r\n#])" % (ind - 1), re.M)
    return _LOW[ind]


def _prefetch(view, words: set[str]) -> dict[str, list[str]]:
    """ONE pass over the tree's files: fill the reader's grep cache for ``words`` (binding
    sites, callers) and return {property name: files defining a ``@property`` of that name}.
    Separate greps would read every file once per word (seconds on a real plugin)."""
    reader = getattr(getattr(view, "tree", None), "reader", None)
    cache = getattr(reader, "_grep", None)
    if reader is None or cache is None or not hasattr(reader, "_all") or not hasattr(reader, "root"):
        return {}
    todo = sorted(w for w in words if w and w not in cache)
    hits: dict[str, list[str]] = {w: [] for w in todo}
    enc = [(w, w.encode()) for w in todo]
    props: dict[str, list[str]] = {}
    blobs: dict[str, bytes] = {}
    for rel in reader._all():
        try:
            with open(reader.root / rel, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        blobs[rel] = data
        for w, b in enc:
            if b in data:
                hits[w].append(rel)
        if b"@property" in data:
            for name in set(_PROP.findall(data)):
                props.setdefault(name.decode(), []).append(rel)
    cache.update(hits)
    # later greps (where did a missing name go? who imports it?) search these bytes, not the disk
    reader._scan = lambda word: [rel for rel, data in blobs.items() if word.encode() in data]
    reader._blobs = blobs
    tree = view.tree
    orig_defs, orig_importers = tree.find_definitions, tree.importers

    def narrowed(pattern: bytes, word: str):
        """grep hits of ``word`` whose text also matches ``pattern`` (parse only those)."""
        rx = re.compile(pattern, re.M)
        keep = [rel for rel in reader.grep(word) if rx.search(blobs.get(rel, b""))]
        return keep

    defined: dict[str, list[str]] = {}

    def find_definitions(name: str) -> list[str]:
        if name not in defined:
            rx = re.compile(rb"(?:async\s+def|def|class)\s+" + re.escape(name).encode() + rb"\b")
            defined[name] = [rel for rel in reader.grep(name) if _module_level_def(blobs.get(rel, b""), rx)]
        hits = defined[name]
        saved = reader._grep.get(name)
        reader._grep[name] = hits
        try:
            return orig_defs(name)
        finally:
            reader._grep[name] = saved if saved is not None else reader._scan(name)

    def importers(module: str, name: str) -> list[str]:
        n = re.escape(name).encode()
        hits = narrowed(rb"import\s+(?:\([^)]*\b" + n + rb"\b|[^\n]*\b" + n + rb"\b)", name)
        saved = reader._grep.get(name)
        reader._grep[name] = hits
        try:
            return orig_importers(module, name)
        finally:
            reader._grep[name] = saved if saved is not None else reader._scan(name)

    tree.find_definitions, tree.importers = find_definitions, importers
    return props


_TOKENS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def _readonly_by_name(view, attr: str, receiver: str, props: dict[str, list[str]]) -> tuple[str, str, str] | None:
    """(module, class, site) of a vLLM class with a READ-ONLY property ``attr`` whose name
    matches the receiver's (``model_executor`` holds an ``Executor``), else None."""
    tree = getattr(view, "tree", None)
    if tree is None:
        return None
    rtoks = {t.lower() for t in _TOKENS.findall(receiver)} | {t.lower() for t in receiver.split("_") if t}
    for rel in props.get(attr, []):
        mod_name = rel[:-3].replace("/", ".").removesuffix(".__init__")
        m = tree.module(mod_name)
        if m is None:
            continue
        for cls in (d for d in m.defs.values() if isinstance(d, ast.ClassDef)):
            ctoks = {t.lower() for t in _TOKENS.findall(cls.name)}
            if not ctoks or not ctoks <= rtoks:     # every word of the class name is in the receiver's
                continue
            info = view.lookup(mod_name, f"{cls.name}.{attr}")
            if info is not None and info.kind == "property" and info.readonly:
                line = next((s.lineno for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == attr),
                            cls.lineno)
                return mod_name, cls.name, f"{rel}:{line}"
    return None


def _dataclass_params(view, module: str, qualname: str) -> list[Param] | None:
    """Keyword parameters of a dataclass-style class (``@dataclass``, vLLM's ``@config``,
    pydantic dataclasses) that defines no ``__init__``: its annotated fields, bases included.
    Only used to check keywords the plugin passes (a removed field is a TypeError)."""
    tree = getattr(view, "tree", None)
    r = tree.resolve(module, qualname) if tree is not None else None
    if r is None or not isinstance(r.node, ast.ClassDef):
        return None
    fields: list[str] = []

    def walk(cls: ast.ClassDef, mod, depth=0) -> bool:
        decos = " ".join(ast.unparse(d) for d in cls.decorator_list)
        if any(isinstance(st, ast.FunctionDef) and st.name == "__init__" for st in cls.body):
            return False
        ok = "dataclass" in decos or re.search(r"\bconfig\b", decos) is not None
        for st in cls.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) \
                    and "ClassVar" not in ast.unparse(st.annotation):
                fields.append(st.target.id)
        for base in (tree.class_bases(cls, mod) if depth < 6 else []):
            if base is not None and not walk(base[1], base[0], depth + 1):
                return False
        return ok
    if not walk(r.node, r.module):
        return None
    return [Param(f, kind="KEYWORD_ONLY", has_default=True) for f in dict.fromkeys(fields)]


# -- the check -------------------------------------------------------------------------

def check_plugin(view, uses: list[Use], plugin: str = "the plugin") -> list[Finding]:
    """Drift findings for one plugin against one vLLM view, one per root cause.

    The cyclic GC is paused meanwhile: parsing the vLLM modules builds millions of AST nodes
    that are kept (cached) anyway, and collections over them were ~25 % of a run."""
    was = gc.isenabled()
    gc.disable()
    try:
        return _check_plugin(view, uses, plugin)
    finally:
        if was:
            gc.enable()


def _check_plugin(view, uses: list[Use], plugin: str) -> list[Finding]:
    out: list[Finding] = []
    seen: dict[tuple, Finding] = {}
    replaced: dict[tuple[str, str], list[Use]] = {}
    rebinds: dict[tuple[str, str], set[str]] = {}
    words = set()
    for u in uses:
        if u.what == "replace" and u.params is not None and not _takes_kwargs(u):
            parts = u.target.split(".")
            if u.is_method and len(parts) > 1:
                words.add(parts[-2])       # callers of a method are found through its class
            else:                          # (a method name such as ``wait`` is in every file)
                words.add(parts[-1])
    props = _prefetch(view, words)
    own_init = {u.target[: -len(".__init__")] for u in uses if u.what == "replace" and u.target.endswith(".__init__")}
    removed = {u.module for u in uses if u.what == "import" and u.module and u.module != u.target
               and not view.has_module(u.module)}

    def add(fs, u: Use, severity: str | None = None, why: str = ""):
        for f in fs:
            # one root cause = one finding; a plugin class missing an abstract method is its own cause
            i = (f.kind, f.symbol, str(f.extra.get("item", "")), u.name if u.what == "subclass" else "")
            if i in seen:          # same root cause from another plugin line: one finding, all sites
                sites = seen[i].extra.setdefault("plugin_sites", [seen[i].extra["plugin_site"]])
                if u.where not in sites:
                    sites.append(u.where)
                continue
            if severity is not None:
                f.severity = severity
            if why:
                f.extra["why"] = why
            seen[i] = f
            f.extra.setdefault("plugin_site", u.where)
            out.append(f)

    removed_mods: dict[str, list[Use]] = {}
    for u in uses:
        if u.what == "env":
            if u.name == "getenv":
                # read from the environment by the plugin itself: only a default that disagrees
                # with vLLM's matters (a VLLM_* name vLLM never declared is the plugin's own)
                if view.env_default(u.target)[0]:
                    add(checks.check_env(view, u.target, u.default), u)
            else:                # through vllm.envs: gone upstream = AttributeError
                add(checks.check_env(view, u.target, None), u)
            continue
        if u.what == "import" and u.target == "vllm":
            continue
        if u.what == "assign_named":
            hit = _readonly_by_name(view, u.target, u.name, props)
            if hit:
                mod, cls, site = hit
                add([checks._f(checks.READONLY_PROPERTY, f"{mod}.{cls}.{u.target}",
                               f"{u.name}.{u.target} = ... assigns {cls}.{u.target}, now a read-only property "
                               f"upstream (the receiver `{u.name}` holds a {cls} by its name): AttributeError",
                               "breaking", f"Stop assigning {u.target}; change the state it is computed from "
                               f"(see {site}).", upstream_site=site)], u,
                    why="assignment to a read-only property raises AttributeError")
            continue
        if u.what == "import" and u.module and u.module != u.target and not view.has_module(u.module):
            removed_mods.setdefault(u.module, []).append(u)
            continue
        if any(u.target.startswith(m + ".") for m in removed):
            if u.what != "import" or not u.module:     # a use of a name from a removed module:
                continue                               # same root cause as the import
        mod, qual = split(view, u.target)
        if u.what in ("assign", "replace"):
            _check_assignment(view, u, mod, qual, add, replaced, rebinds, plugin)
            continue
        use = {"subclass": "subclass"}.get(u.what, "read")
        fs, info = checks.check_presence(view, mod, qual, use=use)
        _presence(view, fs, u, add)
        if info is None or info is True:
            continue
        if u.what == "subclass":
            fs = checks.check_abstract(view, mod, qual, u.methods, who=u.name)
            for f in fs:
                f.extra["upstream_site"] = (upstream_site(view, mod, f"{qual}.{f.extra.get('item')}")
                                            or upstream_site(view, mod, qual))
            add(fs, u, severity="info" if u.abstract else None,
                why="instantiating a class with an unimplemented abstract method raises TypeError")
        elif u.what == "call" and not u.star and u.target not in own_init:
            params = info.params
            fields = params is None and info.kind == "class" and u.kwargs
            if fields:
                params = _dataclass_params(view, mod, qual)
            if params is None:
                continue
            site = upstream_site(view, mod, qual)
            fs = checks.check_params(f"{mod}.{qual}", params, sorted(u.kwargs))
            consumed = {p.name for p in params[: u.npos]}
            if not fields and not any(p.kind == VAR_KEYWORD for p in params):
                fs += checks.check_required(f"{mod}.{qual}", params, u.kwargs | consumed)
            for f in fs:
                f.extra["upstream_site"] = site
            add(fs, u, why="the call raises TypeError")

    for module, us in removed_mods.items():
        _removed_module(view, module, us, add)

    patched = {(h.split(":")[0], f"{h.split(':')[1]}.{n}" if ":" in h else n) for h, n in replaced}
    for (home, name), us in replaced.items():
        for u in us:
            if u.params is not None and not _takes_kwargs(u) \
                    and not (name.startswith("__") and name != "__init__"):
                fs = _override(view, home, name, u, patched)
                add(fs, u, why="upstream callers pass a keyword the installed replacement lacks: TypeError")
                break
        if ":" in home:         # a method: its callers hold the class, there are no binding sites
            continue
        fixed = rebinds[(home, name)]
        fs = checks.check_binding_sites(view, home, name, fixed | {home}, handled=False)
        # A fixed list of rebinds (>= 2 modules) says the plugin means to reach every holder of the
        # original: a site it misses builds with the original (silent).  A plugin that patches one
        # module does not claim the others: info.
        sev = "breaking" if len(fixed) >= 2 else "info"
        for f in fs:
            f.extra["upstream_site"] = _module_site(view, f.extra.get("item", "")) if f.extra.get("item") else ""
            if sev == "info":
                f.fix = (f"Nothing to do unless {plugin} needs its {name} in {f.extra.get('item')}: "
                         f"it patches {', '.join(sorted(fixed))} only.")
        add(fs, us[0], severity=sev, why="a binding site the plugin's fixed rebind list misses keeps the "
            "original object" if sev == "breaking" else "")
    return _finish(out)


def _presence(view, fs: list[Finding], u: Use, add) -> None:
    """Import / read of a name that is gone: breaking unless a fallback catches it."""
    for f in fs:
        if f.kind in (checks.SYMBOL_REMOVED, checks.SYMBOL_MOVED, checks.MODULE_REMOVED) \
                and f.severity == "breaking":
            if u.guarded:
                f.severity = "info"
                f.fix = "Nothing to do: the plugin's `except ImportError` fallback covers it."
                f.extra["guarded"] = True
                add([f], u)
                continue
            mod, _, name = f.symbol.rpartition(".")
            f.extra["upstream_site"] = (upstream_site(view, f.extra["moved_to"][0], name)
                                        if f.extra.get("moved_to") else _module_site(view, mod))
            when = "when that function runs" if u.local else "at import"
            add([f], u, why=f"ImportError/AttributeError {when}")
        else:
            add([f], u)


def _removed_module(view, module: str, us: list[Use], add) -> None:
    """One finding per missing module (not one per imported name)."""
    names = sorted({u.target[len(module) + 1:] for u in us})
    hard = [u for u in us if not u.guarded]
    u0 = (hard or us)[0]
    homes = {}
    for n in names:
        c = [m for m in view.find_definitions(n) if m != module]
        if c:
            homes[n] = c[0]
    where = "; ".join(f"{n} now in {m}" for n, m in homes.items())
    sev = "breaking" if hard else "info"
    f = checks._f(checks.MODULE_REMOVED, module,
                  f"module {module} is gone (the plugin imports {', '.join(names)} from it)"
                  + (f"; {where}" if where else ""), sev,
                  (f"Import from the new home(s): {where}." if homes else
                   "Drop the import or vendor what the plugin needs; nothing upstream defines "
                   f"{', '.join(names)} any more.") if sev == "breaking" else
                  "Nothing to do: the plugin's `except ImportError` fallback covers it.",
                  names=names, moved_to=sorted(set(homes.values())))
    if homes:
        n0 = next(iter(homes))
        f.extra["upstream_site"] = upstream_site(view, homes[n0], n0)
    if sev == "info":
        f.extra["guarded"] = True
    add([f], u0, why=("ImportError " + ("when that function runs" if u0.local else "at import"))
        if sev == "breaking" else "")
    for u in us[1:]:
        add([f], u)


def _check_assignment(view, u: Use, mod: str, qual: str, add, replaced, rebinds, plugin) -> None:
    """``obj.attr = value``: the owner must exist; a read-only property raises; a function or
    method replaced must accept what upstream callers pass."""
    owner_q, _, attr = qual.rpartition(".")
    if not attr:            # assigning a module-level name of a module: ``mod.x`` with qual "x"
        owner_q, attr = "", qual
    fs, oinfo = checks.check_presence(view, mod, owner_q, use="read")
    if fs:
        _presence(view, fs, u, add)
    if oinfo is None:
        return
    info = view.lookup(mod, qual)
    if info is None:
        # only a lazy module can shim the name (asking check_presence otherwise greps the whole tree
        # for where a plugin-own attribute such as ``self.manager`` "went")
        lazy = [f for f in checks.check_presence(view, mod, qual, use="wrap")[0]
                if f.kind == checks.LAZY_SHIM] if view.lazy_module(mod) else []
        if lazy:
            for f in lazy:
                f.extra["upstream_site"] = _module_site(view, mod)
            add(lazy, u, why="assigning into a lazy forwarding module does not reach the module that defines "
                "the name: the patch silently has no effect")
            return
        # the plugin adds a name that upstream does not define (its own hook), or patches a name
        # that has moved: the patch is dead, nothing raises
        if u.what == "replace" and u.params is not None and owner_q and u.is_method:
            add([checks._f(checks.SYMBOL_REMOVED, f"{mod}.{qual}",
                           f"{plugin} installs {u.name} as {qual}, which upstream does not define: a new hook "
                           "of the plugin is fine; an override of a renamed or removed method no longer runs",
                           "info", f"Check that {owner_q} still calls {attr} (or the plugin's own code does).")], u)
        elif u.what == "replace" and u.params is not None:
            cands = [c for c in view.find_definitions(attr) if c != mod] if not owner_q else []
            if cands:
                add([checks._f(checks.SYMBOL_MOVED, f"{mod}.{qual}",
                               f"{plugin} installs {u.name} as {mod}.{qual}, which upstream no longer "
                               f"defines ({attr} is now in {', '.join(cands)}): the patch has no effect",
                               "info", f"Check whether {cands[0]}.{attr} still needs the plugin's version.",
                               moved_to=cands)], u)
        return
    if info.kind == "property":
        if info.readonly:
            f = checks.check_assign(view, mod, qual, who=u.name or plugin)
            for x in f:
                x.extra["upstream_site"] = upstream_site(view, mod, qual)
            add(f, u, why="assignment to a read-only property raises AttributeError")
        return
    if u.what != "replace":
        return
    if info.kind in ("function", "method"):
        home = info.where or mod
        if info.kind == "method" and owner_q:
            home = f"{mod}:{owner_q}"
        replaced.setdefault((home, attr), []).append(u)
        rebinds.setdefault((home, attr), set()).add(mod)


def _takes_kwargs(u: Use) -> bool:
    return u.params is not None and any(p.kind == VAR_KEYWORD for p in u.params)


def _enclosing(tree: ast.Module) -> dict[int, str]:
    """id(call node) -> qualname of the function/method holding it ("" at module level)."""
    out: dict[int, str] = {}

    def walk(node, qual):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.ClassDef):
                walk(ch, f"{qual}.{ch.name}" if qual else ch.name)
            elif isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(ch, f"{qual}.{ch.name}" if qual else ch.name)
            else:
                if isinstance(ch, ast.Call):
                    out[id(ch)] = qual
                walk(ch, qual)
    walk(tree, "")
    return out


def _override(view, home: str, name: str, u: Use, patched: set[tuple[str, str]]) -> list[Finding]:
    """Replacement lacks a keyword upstream callers pass (functions, methods, ``__init__``).
    Callers inside code the plugin also replaces never run: they are not evidence."""
    params = u.params
    if ":" not in home:
        fs = checks.check_override(view, home, name, params, who=u.name)
        for f in fs:
            m = re.search(r"\(line (\d+)\)", f.detail)
            f.extra["upstream_site"] = f"{_module_site(view, f.extra.get('caller', ''))}:{m.group(1) if m else 0}"
        return fs
    mod, cls = home.split(":", 1)
    if u.is_method:
        params = params[1:]
    callee = cls if name == "__init__" else name
    out, seen = [], set()
    tree = getattr(view, "tree", None)
    if tree is None:
        return []
    # candidate callers by text first (the class is named AND the call is spelled there): a class
    # such as ParallelConfig is imported by hundreds of modules, parsing them all costs seconds
    call_text = f"{cls}(" if name == "__init__" else f".{name}("
    blobs = getattr(tree.reader, "_blobs", None)
    if blobs is not None:      # the files naming the class, read once by _prefetch: no tree-wide grep
        files = sorted(r for r in tree.reader.grep(cls) if call_text.encode() in blobs.get(r, b""))
    else:
        files = sorted(set(tree.reader.grep(cls)) & set(tree.reader.grep(call_text)))
    sites = list(dict.fromkeys([mod] + [r[:-3].replace("/", ".").removesuffix(".__init__") for r in files]))
    for site in sites:
        m = tree.module(site) if tree is not None else None
        if m is None:
            continue
        calls = []
        for n in ast.walk(m.tree):
            if not isinstance(n, ast.Call) or any(k.arg is None for k in n.keywords):
                continue
            f = n.func
            cname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            missing = [k.arg for k in n.keywords if k.arg and not any(p.name == k.arg for p in params)]
            if cname == callee and missing:
                calls.append((n, missing))
        encl = _enclosing(m.tree) if calls else {}
        for n, missing in calls:
            if (site, encl.get(id(n), "")) in patched:
                continue
            for kw in sorted(missing):
                if kw in seen:
                    continue
                seen.add(kw)
                what = f"{cls}.{name}"
                out.append(checks._f(
                    checks.OVERRIDE_MISSING, f"{mod}.{what}",
                    f"{u.name} is installed as {what}, but upstream {site} (line {n.lineno}) calls "
                    f"{callee}(..., {kw}=...): TypeError when that call runs", "breaking",
                    f"Add `{kw}` to {u.name}'s signature (mirror upstream {what}), or accept **kwargs.",
                    item=kw, caller=site, upstream_site=f"{m.relpath}:{n.lineno}"))
    return out


def _finish(out: list[Finding]) -> list[Finding]:
    """Breaking first, then by symbol; every breaking finding names why it breaks."""
    for f in out:
        if f.severity == "breaking" and not f.extra.get("why"):
            f.extra["why"] = f.detail
    return sorted(out, key=lambda f: (f.severity != "breaking", f.kind, f.symbol, str(f.extra.get("item", ""))))
