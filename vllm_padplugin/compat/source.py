"""Read a vLLM source tree statically (``ast``; nothing imported, no compiled parts needed).

A ``Tree`` answers questions about modules and symbols from the text of the files;
where the text comes from is a ``Reader``: a directory on disk, or one git revision
read with ``git cat-file --batch`` (see ``gitscan``), so checking a commit never
needs a checkout.  Parsed files are cached per tree.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol

from ..install_cache import note, recording_active as recording
from .sigdiff import (KEYWORD_ONLY, POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_KEYWORD,
                      VAR_POSITIONAL, Param)


class SourceError(Exception):
    """Bad input about a source tree (exit 2 in the CLI)."""


class Reader(Protocol):
    def read(self, relpath: str) -> str | None: ...          # text, or None if absent
    def grep(self, word: str) -> list[str]: ...              # relpaths (under vllm/) containing word
    def label(self) -> str: ...


class DirReader:
    """Files of a checkout/extracted release; ``root`` holds the ``vllm`` package dir."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._files: list[str] | None = None
        self._grep: dict[str, list[str]] = {}
        self._bytes: dict[str, bytes] | None = None

    def read(self, relpath: str) -> str | None:
        p = self.root / relpath
        note(p)  # the per-install cache: an answer read from this file is valid while it is unchanged
        try:
            return p.read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def _all(self) -> list[str]:
        if self._files is None:
            out = []
            base = self.root / "vllm"
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = [d for d in dirnames if not d.startswith((".", "__pycache__"))]
                rel = os.path.relpath(dirpath, self.root)
                out.extend(f"{rel}/{f}".replace(os.sep, "/") for f in filenames if f.endswith(".py"))
            self._files = sorted(out)
        return self._files

    def grep(self, word: str) -> list[str]:
        if recording():  # the per-install cache: a search depends on every file (and directory)
            files = [self.root / rel for rel in self._all()]
            note(*files, *{f.parent for f in files})
        if word not in self._grep:
            self._grep[word] = self._scan(word)
        return self._grep[word]

    def _scan(self, word: str) -> list[str]:
        # the first scan keeps the bytes: later words (a relocation search asks several) are
        # looked up in memory instead of re-reading every file
        if self._bytes is None:
            self._bytes = {}
            root = str(self.root)
            for rel in self._all():
                try:
                    with open(os.path.join(root, rel), "rb") as fh:
                        self._bytes[rel] = fh.read()
                except OSError:
                    continue
        w = word.encode()
        return [rel for rel, data in self._bytes.items() if w in data]

    def label(self) -> str:
        return str(self.root)


def locate_vllm_root(path: str | os.PathLike) -> Path:
    """The directory containing the ``vllm`` package: ``path`` itself or its parent."""
    p = Path(path).expanduser()
    if not p.exists():
        raise SourceError(f"path does not exist: {p}")
    if not p.is_dir():
        raise SourceError(f"not a directory: {p}")
    if (p / "vllm" / "__init__.py").is_file():
        return p.resolve()
    if p.name == "vllm" and (p / "__init__.py").is_file():
        return p.resolve().parent
    raise SourceError(f"not a vLLM source tree (no vllm/__init__.py in or at {p})")


def module_paths(module: str) -> tuple[str, str]:
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def _param_list(args: ast.arguments) -> list[Param]:
    out: list[Param] = []
    pos = list(args.posonlyargs) + list(args.args)
    defaults = [None] * (len(pos) - len(args.defaults)) + list(args.defaults)
    for i, (a, d) in enumerate(zip(pos, defaults)):
        kind = POSITIONAL_ONLY if i < len(args.posonlyargs) else POSITIONAL_OR_KEYWORD
        out.append(Param(a.arg, kind, d is not None, ast.unparse(d) if d is not None else None))
    if args.vararg:
        out.append(Param(args.vararg.arg, VAR_POSITIONAL))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append(Param(a.arg, KEYWORD_ONLY, d is not None, ast.unparse(d) if d is not None else None))
    if args.kwarg:
        out.append(Param(args.kwarg.arg, VAR_KEYWORD))
    return out


def params_of(node: ast.AST) -> list[Param]:
    """Parameters of a ``def``/``lambda`` node."""
    return _param_list(node.args)  # type: ignore[attr-defined]


def _body_defs(body: Iterable[ast.stmt]) -> Iterable[ast.stmt]:
    """Statements of a body, descending into if/try/with (conditional definitions)."""
    for st in body:
        if isinstance(st, (ast.If, ast.Try, ast.With)) or type(st).__name__ == "TryStar":
            yield from _body_defs(getattr(st, "body", []))
            yield from _body_defs(getattr(st, "orelse", []))
            for h in getattr(st, "handlers", []):
                yield from _body_defs(h.body)
            yield from _body_defs(getattr(st, "finalbody", []))
        else:
            yield st


def decorator_names(node: ast.AST) -> list[str]:
    out = []
    for d in getattr(node, "decorator_list", []):
        d = d.func if isinstance(d, ast.Call) else d
        out.append(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return out


@dataclass
class Module:
    name: str
    relpath: str
    tree: ast.Module
    defs: dict[str, ast.stmt] = field(default_factory=dict)        # top-level def/class
    imports: dict[str, str] = field(default_factory=dict)          # local name -> "mod:name" or "mod:"
    assigns: dict[str, ast.stmt] = field(default_factory=dict)     # other top-level names
    lazy_getattr: bool = False                                     # module-level __getattr__

    @classmethod
    def build(cls, name: str, relpath: str, tree: ast.Module, is_pkg: bool) -> "Module":
        m = cls(name, relpath, tree)
        pkg = name if is_pkg else name.rpartition(".")[0]
        for st in _body_defs(tree.body):
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                m.defs[st.name] = st
                if st.name == "__getattr__":
                    m.lazy_getattr = True
            elif isinstance(st, ast.ImportFrom):
                src = resolve_relative(pkg, st.module, st.level)
                for a in st.names:
                    m.imports[a.asname or a.name] = f"{src}:{a.name}"
            elif isinstance(st, ast.Import):
                for a in st.names:
                    m.imports[a.asname or a.name.split(".")[0]] = f"{a.name if a.asname else a.name.split('.')[0]}:"
            elif isinstance(st, (ast.Assign, ast.AnnAssign)):
                for t in (st.targets if isinstance(st, ast.Assign) else [st.target]):
                    for n in ast.walk(t):     # a = b = ..., (a, b) = ..., x: T (also TYPE_CHECKING)
                        if isinstance(n, ast.Name):
                            m.assigns.setdefault(n.id, st)
        return m


def resolve_relative(pkg: str, module: str | None, level: int) -> str:
    if not level:
        return module or ""
    parts = pkg.split(".")
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{module}" if module else base


@dataclass
class Resolved:
    """Where a dotted symbol was found."""

    module: Module
    node: ast.AST | None           # def/class/AnnAssign node, None for a module
    owner: ast.ClassDef | None = None   # the class, for "Class.member"
    via: str = ""                  # re-export chain, e.g. "vllm.a -> vllm.b"


# parsed modules by (name, path, content hash): unchanged files are parsed once per process
# (a --git range re-reads the same blobs at every commit).  Modules are read-only after build.
_PARSED: dict[tuple, Module] = {}


class Tree:
    """Static view of one vLLM tree (directory or git revision)."""

    def __init__(self, reader: Reader):
        self.reader = reader
        self._mods: dict[str, Module | None] = {}
        self._texts: dict[str, str | None] = {}
        self.errors: list[str] = []        # syntax errors met (reported, scan goes on)

    # -- modules ---------------------------------------------------------
    def module(self, name: str) -> Module | None:
        if name in self._mods:
            return self._mods[name]
        mod = None
        for i, rel in enumerate(module_paths(name)):
            text = self._text(rel)
            if text is None:
                continue
            digest = (name, rel, hashlib.blake2b(text.encode(), digest_size=16).digest())
            mod = _PARSED.get(digest)
            if mod is None:
                try:
                    tree = ast.parse(text, filename=rel)
                except SyntaxError as e:
                    self.errors.append(f"{rel}:{e.lineno}: syntax error: {e.msg}")
                    mod = None
                    break
                mod = Module.build(name, rel, tree, is_pkg=(i == 1))
                if len(_PARSED) > 512:
                    _PARSED.clear()
                _PARSED[digest] = mod
            break
        self._mods[name] = mod
        return mod

    def module_exists(self, name: str) -> bool:
        if self._mods.get(name) is not None:
            return True
        return any(self._text(r) is not None for r in module_paths(name))

    def _text(self, rel: str) -> str | None:
        if rel not in self._texts:
            self._texts[rel] = self.reader.read(rel)
        return self._texts[rel]

    def quick_top_level(self, module: str, name: str) -> str | None:
        """'class'/'function' when the module's text defines ``name`` at column 0 (no parse).
        Only a positive answer is trusted; anything else goes through the parser."""
        if "." in name or not name:
            return None
        for rel in module_paths(module):
            text = self._text(rel)
            if text is None:
                continue
            m = re.search(rf"^(class|def|async def)\s+{re.escape(name)}\b", text, re.M)
            return None if m is None else ("class" if m.group(1) == "class" else "function")
        return None

    # -- symbols ---------------------------------------------------------
    def resolve(self, module: str, qualname: str, _depth: int = 0) -> Resolved | None:
        """Find ``module:qualname`` following re-exports (``from x import y``)."""
        mod = self.module(module)
        if mod is None or _depth > 6:
            return None
        if not qualname:
            return Resolved(mod, None)
        head, _, rest = qualname.partition(".")
        node = mod.defs.get(head)
        if node is None and head in mod.imports:
            src, _, name = mod.imports[head].partition(":")
            if name:
                r = self.resolve(src, name + (f".{rest}" if rest else ""), _depth + 1)
                if r is None and self.module_exists(f"{src}.{name}"):
                    r = self.resolve(f"{src}.{name}", rest, _depth + 1)
            else:
                r = self.resolve(src, rest, _depth + 1)
            if r is not None:
                r.via = f"{module} -> {r.via or r.module.name}"
                return r
            if head in mod.assigns:      # import failed statically (try/except fallback etc.)
                return Resolved(mod, mod.assigns[head])
            return None
        if node is None and head in mod.assigns:
            # a value (instance, constant, lazily provided name): deeper attributes are not knowable
            return Resolved(mod, mod.assigns[head])
        if node is None:
            if not rest and self.module_exists(f"{module}.{head}"):
                return self.resolve(f"{module}.{head}", "", _depth + 1)
            return None
        if not rest:
            return Resolved(mod, node)
        if not isinstance(node, ast.ClassDef):
            return None
        member = self.class_member(node, rest, mod)
        if member is None:
            return None
        return Resolved(mod, member, owner=node)

    def class_member(self, cls: ast.ClassDef, name: str, mod: Module) -> ast.AST | None:
        for st in _body_defs(cls.body):
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and st.name == name:
                if isinstance(st, ast.FunctionDef) and "setter" in decorator_names(st):
                    continue
                return st
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id == name:
                return st
            if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in st.targets):
                return st
        init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        if init is not None:
            for n in ast.walk(init):
                if isinstance(n, (ast.Assign, ast.AnnAssign)):
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                        if (isinstance(t, ast.Attribute) and t.attr == name and isinstance(t.value, ast.Name)
                                and t.value.id == "self"):
                            return n
        # inherited from a base defined in this tree
        for base in self.class_bases(cls, mod):
            if base is None:
                continue
            bmod, bcls = base
            m = self.class_member(bcls, name, bmod)
            if m is not None:
                return m
        return None

    def class_bases(self, cls: ast.ClassDef, mod: Module) -> list[tuple[Module, ast.ClassDef] | None]:
        out: list[tuple[Module, ast.ClassDef] | None] = []
        for b in cls.bases:
            dotted = ast.unparse(b)
            head, _, rest = dotted.partition(".")
            if head in mod.defs:
                r = Resolved(mod, mod.defs[head]) if not rest else None
            elif head in mod.imports:
                src, _, name = mod.imports[head].partition(":")
                r = self.resolve(src, ".".join(x for x in (name, rest) if x))
            else:
                r = None
            out.append((r.module, r.node) if r is not None and isinstance(r.node, ast.ClassDef) else None)
        return out

    def abstract_methods(self, cls: ast.ClassDef, mod: Module, _seen: int = 0) -> set[str]:
        """Abstract methods a concrete subclass of ``cls`` must implement."""
        abstract: set[str] = set()
        concrete: set[str] = set()
        for st in _body_defs(cls.body):
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                (abstract if "abstractmethod" in decorator_names(st) else concrete).add(st.name)
        if _seen < 8:
            for base in self.class_bases(cls, mod):
                if base is not None:
                    abstract |= self.abstract_methods(base[1], base[0], _seen + 1) - concrete
        return abstract - concrete

    def function_params(self, module: str, qualname: str) -> list[Param] | None:
        r = self.resolve(module, qualname)
        if r is None:
            return None
        node = r.node
        if isinstance(node, ast.ClassDef):
            init = self.class_member(node, "__init__", r.module)
            node = init
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return params_of(node)
        return None

    def find_definitions(self, name: str) -> list[str]:
        """Modules in this tree that define ``name`` at top level (where did it move?)."""
        out = []
        for rel in self.reader.grep(name):
            mod_name = rel[:-3].replace("/", ".")
            if mod_name.endswith(".__init__"):
                mod_name = mod_name[: -len(".__init__")]
            m = self.module(mod_name)
            if m is not None and isinstance(m.defs.get(name), (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                out.append(mod_name)
        return sorted(out)

    def importers(self, module: str, name: str) -> list[str]:
        """Modules binding ``name`` imported by name from ``module`` (binding sites), directly or
        through a re-export.  A vLLM module importing a same-named symbol that another module
        defines is not one (vLLM main's ``hw_agnostic`` MoE layers import their own
        ``create_fused_moe_router``); an import whose source cannot be resolved here still counts."""
        out = []
        for rel in self.reader.grep(name):
            mod_name = rel[:-3].replace("/", ".")
            if mod_name.endswith(".__init__"):
                mod_name = mod_name[: -len(".__init__")]
            if mod_name == module:
                continue
            m = self.module(mod_name)
            if m is None:
                continue
            target = m.imports.get(name, "")
            src, _, imported = target.partition(":")
            if target == f"{module}:{name}" or (imported == name and src.startswith("vllm")
                                                and self._defined_in(src, name) in (module, None)):
                out.append(mod_name)
        return sorted(out)

    def _defined_in(self, module: str, name: str) -> str | None:
        """The module defining ``module:name`` after re-exports; None when not resolvable here."""
        r = self.resolve(module, name)
        return None if r is None or r.node is None else r.module.name


def function_params(src_root: str | os.PathLike, module: str, qualname: str) -> list[Param] | None:
    """Signature of ``module:qualname`` read from source under ``src_root`` (no import).

    ``src_root`` is a repo root holding ``vllm/`` or the ``vllm`` package dir itself.
    Classes give their ``__init__`` parameters (``self`` included). None if absent.
    """
    return Tree(DirReader(locate_vllm_root(src_root))).function_params(module, qualname)


def read_version(tree: Tree) -> str | None:
    """``vllm/_version.py``'s ``__version__`` (generated at build), statically."""
    text = tree.reader.read("vllm/_version.py")
    if not text:
        return None
    try:
        mod = ast.parse(text)
    except SyntaxError:
        return None
    for st in mod.body:
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
            if any(isinstance(t, ast.Name) and t.id in ("__version__", "version") for t in st.targets):
                return st.value.value
    return None
