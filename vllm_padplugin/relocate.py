"""Find each registry symbol where the installed (or checked) vLLM keeps it now.

vLLM main reorganises its packages (``vllm/forward_context.py`` ->
``vllm/runtime/execution/forward_context.py``, ``vllm.envs`` ->
``vllm.foundation.system.envs``, ...).  The registry (``surface.py``) names one path per
symbol; this module resolves every entry, in this order:

1. the known path (the registry's module), when it still defines the symbol there;
2. a forwarding shim at the old path: a re-export (``from new import X``), ``from new import *``,
   a module ``__getattr__`` or a ``sys.modules`` alias naming the new module: the symbol is
   used where it is DEFINED (patching a shim does not reach the real module's callers);
3. the registry's ``moved_to`` hint;
4. a static search of the vLLM files (``ast``; never an import) for a module that defines
   the symbol with the properties the plugin relies on (kind, parameters, class members).
   Two candidates are an error naming both, never a guess, unless exactly one of them is
   where the entry's package-mates moved (5.).
5. siblings: an ambiguous entry whose old module, moved the way another entry's verified
   move went (the same dotted head replaced), names exactly one of its candidates, is taken
   there.  vLLM main has a second MoE path (``vllm/model_executor/hw_agnostic``) with its own
   ``create_fused_moe_router`` and ``fused_moe/layer.py``: were the MoE package to move,
   the search alone would find two of each.

Optional entries (the legacy runner, removed in 0.34) are never searched: their successor
is a different thing, and "absent" is already fine for them.

The result is a ``Relocation``: per key a ``Location``, the registry with moved entries
rewritten (``surface()``), and one ``symbol-moved`` info finding per move (old module ->
new module), or a breaking ``symbol-ambiguous`` one.  Runtime patches ask ``where(key)``
(the installed vLLM, resolved once per process; the search part cached per install).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .surface import SURFACE, Finding, Kind, Symbol, Use

logger = logging.getLogger("vllm_padplugin")

KNOWN, MOVED, MISSING, AMBIGUOUS = "known", "moved", "missing", "ambiguous"
SYMBOL_MOVED = "symbol-moved"          # same string as compat.checks.SYMBOL_MOVED
SYMBOL_AMBIGUOUS = "symbol-ambiguous"

# what a definition found elsewhere must be, per registry kind (SymInfo.kind values)
_KINDS = {
    Kind.FUNCTION: {"function"},
    Kind.CLASS: {"class"},
    Kind.METHOD: {"method"},
    Kind.FIELD: {"field", "attr", "property"},
    Kind.PROPERTY: {"property"},
    Kind.PROPAGATION: {"method", "function"},
}


@dataclass(frozen=True)
class Location:
    key: str
    module: str                  # where the plugin uses it now
    qualname: str
    status: str                  # known | moved | missing | ambiguous
    via: str = ""                # moved: "shim" | "hint" | "search" | "siblings"
    old: str = ""                # the registry's module, when moved
    candidates: tuple[str, ...] = ()   # ambiguous, siblings: every module that matched

    @property
    def path(self) -> str:
        return f"{self.module}.{self.qualname}" if self.qualname else self.module


@dataclass
class Relocation:
    locations: dict[str, Location] = field(default_factory=dict)
    sites: dict[str, tuple[str, ...]] = field(default_factory=dict)   # REBIND key -> relocated sites
    base: tuple[Symbol, ...] = SURFACE

    def moved(self) -> list[Location]:
        return [loc for loc in self.locations.values() if loc.status == MOVED]

    def symbol(self, key: str) -> Symbol:
        """The registry entry ``key`` pointed at its current home (unchanged when not moved)."""
        s = next((x for x in self.base if x.key == key), None)
        if s is None:
            from .surface import get

            s = get(key)
        loc = self.locations.get(key)
        kw = {}
        if loc is not None and loc.status in (MOVED, MISSING) and loc.module != s.module:
            kw.update(module=loc.module, qualname=loc.qualname)
        if key in self.sites:
            kw["sites"] = self.sites[key]
        return dataclasses.replace(s, **kw) if kw else s

    def surface(self) -> tuple[Symbol, ...]:
        return tuple(self.symbol(s.key) for s in self.base)

    def findings(self) -> list[Finding]:
        """One info finding per move (old module -> new module), one breaking per ambiguity."""
        out: list[Finding] = []
        groups: dict[tuple[str, str, str], list[Location]] = {}
        for loc in self.moved():
            groups.setdefault((loc.old, loc.module, loc.via), []).append(loc)
        for (old, new, via), locs in groups.items():
            names = sorted({loc.qualname or f"module {old}" for loc in locs})
            how = {"shim": "the old path forwards to it", "hint": "the registry's moved_to hint",
                   "search": "a static search of the vLLM files",
                   "siblings": "the one of the search's candidates ("
                               + ", ".join(locs[0].candidates) + ") where its package-mates moved",
                   }[via]
            out.append(Finding(
                kind=SYMBOL_MOVED, symbol=old, severity="info", key=locs[0].key,
                detail=f"found {', '.join(names)} at {new} (moved from {old}; via {how}); "
                       "the plugin follows the move",
                fix="Nothing to do: patches, binding sites and checks use the new home. Add it to "
                    "the registry's moved_to when convenient.",
                extra={"status": "moved", "moved_from": old, "moved_to": [new], "via": via,
                       "keys": sorted(loc.key for loc in locs), "names": names}))
        for loc in self.locations.values():
            if loc.status == AMBIGUOUS:
                out.append(Finding(
                    kind=SYMBOL_AMBIGUOUS, symbol=f"{loc.old}.{loc.qualname}".rstrip("."), key=loc.key,
                    detail=f"{loc.qualname or loc.old} is gone from {loc.old} and is defined, with the "
                           f"properties the plugin relies on, in {len(loc.candidates)} modules: "
                           f"{', '.join(loc.candidates)}; the plugin does not guess",
                    fix=f"Name the right one in the registry's moved_to ({loc.candidates[0]}:{loc.qualname} "
                        f"or {loc.candidates[1]}:{loc.qualname}).",
                    extra={"status": "ambiguous", "candidates": list(loc.candidates)}))
        return out


# -- resolution -------------------------------------------------------------------------

def relocate(view, surface=SURFACE, search=None, prior: Relocation | None = None) -> Relocation:
    """Resolve every entry of ``surface`` against ``view`` (a compat StaticView or RuntimeView).

    ``search(name, want)`` finds candidate modules (default: ``static_search`` over the view).
    ``prior``: the relocation of a neighbouring commit (``compat --git``): a home found there that
    still fits here is taken without a new search (ambiguity is checked at the commits that do
    search, always at ``--bad``/HEAD)."""
    search = search or (lambda name, kind: static_search(view, name, kind))
    rel = Relocation(base=tuple(surface))
    for s in surface:
        loc = prior.locations.get(s.key) if prior is not None else None
        if (loc is not None and loc.status == MOVED and loc.via == "search"
                and not _still_at_known_path(view, s) and _fits_location(view, s, loc.module)):
            rel.locations[s.key] = loc
            continue
        rel.locations[s.key] = resolve_symbol(view, s, search)
    _by_siblings(rel)
    # a symbol found nowhere whose module-mates all moved to ONE new module is reported as
    # removed from THAT module (not "module gone"): the move is known, the symbol is not there
    homes: dict[str, set[str]] = {}
    for loc in rel.moved():
        homes.setdefault(loc.old, set()).add(loc.module)
    for key, loc in list(rel.locations.items()):
        s = next(x for x in surface if x.key == key)
        if loc.status == MISSING and not s.optional and len(homes.get(s.module, ())) == 1:
            rel.locations[key] = dataclasses.replace(loc, module=next(iter(homes[s.module])), old=s.module)
    moved_modules = {loc.old: loc.module for loc in rel.moved() if not loc.qualname}
    for s in surface:
        # known sites follow a move; a known site absent from an unmoved tree is normal (step5
        # mega_moe exists since 0.33 only) and is not searched for
        if s.use == Use.REBIND and s.sites and (rel.locations[s.key].status == MOVED or moved_modules):
            fac = rel.symbol(s.key)
            rel.sites[s.key] = tuple(moved_modules.get(site) or relocate_site(view, site, fac, search)
                                     for site in s.sites)
    return rel


def _by_siblings(rel: Relocation) -> None:
    """Step 5 of the module docstring: settle an ambiguous entry by its package-mates' moves."""
    moves = rel.moved()
    for key, loc in list(rel.locations.items()):
        if loc.status != AMBIGUOUS:
            continue
        hits = {moved_like(m.old, m.module, loc.old) for m in moves} & set(loc.candidates)
        if len(hits) == 1:
            rel.locations[key] = Location(key, hits.pop(), loc.qualname, MOVED, "siblings", loc.old,
                                          loc.candidates)


def moved_like(old: str, new: str, module: str) -> str:
    """Pure: ``module`` moved as ``old`` moved to ``new`` (their common dotted tail kept, the head
    before it replaced); "" when ``module`` is not under that head.
    ``moved_like("a.b.x.y", "a.c.x.y", "a.b.z")`` is ``"a.c.z"``."""
    a, b = old.split("."), new.split(".")
    n = 0
    while n < min(len(a), len(b)) - 1 and a[-1 - n] == b[-1 - n]:
        n += 1
    head_old, head_new = a[:len(a) - n], b[:len(b) - n]
    parts = module.split(".")
    if parts[:len(head_old)] != head_old or len(parts) == len(head_old):
        return ""
    return ".".join(head_new + parts[len(head_old):])


def resolve_symbol(view, s: Symbol, search) -> Location:
    head = s.qualname.split(".")[0] if s.qualname else ""
    if s.kind == Kind.ENV:
        return _resolve_env(view, s, search)
    # 1. known path
    if view.has_module(s.module):
        if not head:
            if view.lazy_module(s.module):   # a lazy forwarding module: use what it forwards to
                word = _module_word(s)
                for target in forward_targets(view, s.module):
                    if target in search(word, "module"):
                        return Location(s.key, target, "", MOVED, "shim", s.module)
            return Location(s.key, s.module, "", KNOWN)
        if view.lookup(s.module, s.qualname) is not None:
            # still there (a changed signature is a drift finding of its own, not a move) ...
            where = _defining_module(view, s.module, head)
            if where and where != s.module and not where.startswith(s.module + ".") and _fits(view, s, where):
                return Location(s.key, where, s.qualname, MOVED, "shim", s.module)   # ... or re-exported
            if not (view.lazy_module(s.module) and not view.defined_here(s.module, head)):
                return Location(s.key, s.module, s.qualname, KNOWN)
        # 2. forwarding shim at the old path
        for target in forward_targets(view, s.module):
            if _fits(view, s, target):
                where = _defining_module(view, target, head) or target
                return Location(s.key, where if _fits(view, s, where) else target, s.qualname, MOVED, "shim",
                                s.module)
    if s.optional:
        return Location(s.key, s.module, s.qualname, MISSING)
    # 3. the registry's hint
    for hint in s.moved_to:
        mod, _, qual = hint.partition(":")
        if qual == s.qualname and _fits(view, s, mod):
            return Location(s.key, mod, s.qualname, MOVED, "hint", s.module)
    # 4. static search
    if not head:
        cands = [m for m in search(_module_word(s), "module") if _same_tail(m, s.module)]
    else:
        cands = [m for m in search(head, "member" if "." in s.qualname else "top") if m != s.module]
        cands = [m for m in cands if _fits(view, s, m)]
    return _from_search(s, cands)


def _from_search(s: Symbol, cands) -> Location:
    """One candidate: moved there; several: ambiguous (never a guess); none: missing."""
    cands = sorted(set(cands))
    if len(cands) == 1:
        return Location(s.key, cands[0], s.qualname, MOVED, "search", s.module)
    if len(cands) > 1:
        return Location(s.key, s.module, s.qualname, AMBIGUOUS, old=s.module, candidates=tuple(cands))
    return Location(s.key, s.module, s.qualname, MISSING)


def _resolve_env(view, s: Symbol, search) -> Location:
    if view.env_default(s.qualname, s.module)[0]:
        return Location(s.key, s.module, s.qualname, KNOWN)
    for target in forward_targets(view, s.module) if view.has_module(s.module) else []:
        if view.env_default(s.qualname, target)[0]:
            return Location(s.key, target, s.qualname, MOVED, "shim", s.module)
    for hint in s.moved_to:
        mod = hint.partition(":")[0]
        if view.env_default(s.qualname, mod)[0]:
            return Location(s.key, mod, s.qualname, MOVED, "hint", s.module)
    return _from_search(s, [m for m in search(s.qualname, "module") if _same_tail(m, s.module)
                            and m != s.module and view.env_default(s.qualname, m)[0]])


def relocate_site(view, site: str, factory: Symbol, search) -> str:
    """A known binding site's current module: unchanged if it exists, else the one module
    importing the (relocated) factory whose last name part is the same (``...fused_moe.layer``)."""
    if view.has_module(site):
        return site
    cands = [m for m in view.binding_sites(factory.module, factory.qualname) if _same_tail(m, site)]
    return cands[0] if len(cands) == 1 else site


def _still_at_known_path(view, s: Symbol) -> bool:
    if s.kind == Kind.ENV:
        return view.env_default(s.qualname, s.module)[0]
    return view.has_module(s.module) and (not s.qualname or view.lookup(s.module, s.qualname) is not None)


def _fits_location(view, s: Symbol, module: str) -> bool:
    if s.kind == Kind.ENV:
        return view.env_default(s.qualname, module)[0]
    if not s.qualname:
        return view.has_module(module)
    return _fits(view, s, module)


def _fits(view, s: Symbol, module: str) -> bool:
    """``module`` defines ``s.qualname`` as the kind the plugin expects, with the parameters
    it relies on (backport-supplied ones excepted) and, for "Class.member", the member."""
    from .compat.sigdiff import accepts

    info = view.lookup(module, s.qualname)
    if info is None:
        return False
    want = _KINDS.get(s.kind)
    if want is not None and info.kind not in want:
        return False
    need = [p for p in s.params if p not in s.backport] if s.kind != Kind.PROPAGATION else []
    if need:
        params = info.params
        if params is None or not all(accepts(params, p) for p in need):
            return False
    return True


def _defining_module(view, module: str, head: str) -> str:
    info = view.lookup(module, head)
    return getattr(info, "where", "") or "" if info is not None else ""


def _same_tail(a: str, b: str) -> bool:
    return a.rsplit(".", 1)[-1] == b.rsplit(".", 1)[-1]


def _module_word(s: Symbol) -> str:
    """A word every candidate for a MODULE entry must contain: the factory it binds (the
    registry's ``sites``/why name it), else the module's own last name part."""
    if s.key == "fused_moe_layer":
        return "create_fused_moe_router"
    return s.module.rsplit(".", 1)[-1]


def forward_targets(view, module: str) -> list[str]:
    """Modules an old-path module forwards to: ``from X import *``, modules named in string
    constants (``__getattr__`` / ``importlib.import_module`` / ``sys.modules[...] = ...``),
    ``import X`` of vllm modules.  Read from the file, nothing imported."""
    import ast

    tree = getattr(view, "tree", None)
    m = tree.module(module) if tree is not None else None
    if m is None:
        return []
    out: list[str] = []
    for local, target in m.imports.items():
        src, _, name = target.partition(":")
        if (local == "*" or name == "*" or not name) and src.startswith("vllm"):
            out.append(src)
    for node in ast.walk(m.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("vllm."):
            val = node.value.rsplit(":", 1)[0]
            if val != module and tree.module_exists(val):
                out.append(val)
    seen, uniq = set(), []
    for t in out:
        if t not in seen and t != module:
            seen.add(t)
            uniq.append(t)
    return uniq


def _may_define(text: str, name: str, attrs: bool) -> bool:
    """A cheap text test before parsing: ``def``/``class NAME`` or (attrs) a line starting
    with ``NAME:`` / ``NAME =`` (literal-prefixed regexes; no per-line anchoring)."""
    import re

    if f"def {name}" in text or f"class {name}" in text:
        return True
    if not attrs:
        return False
    for m in re.finditer(rf"{re.escape(name)}[ \t]*(?::|=(?!=))", text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if not text[line_start:m.start()].strip():
            return True
    return False


def static_search(view, name: str, kind: str) -> list[str]:
    """Modules of the view's tree that DEFINE ``name`` (top-level def/class, or a top-level
    assignment/annotation for attributes); kind "module": modules whose text contains it."""
    tree = view.tree
    hits = tree.reader.grep(name)
    # only files whose text could define it are parsed (a name is used in hundreds of files)
    out = []
    for rel in hits:
        mod = rel[:-3].replace("/", ".")
        mod = mod[: -len(".__init__")] if mod.endswith(".__init__") else mod
        if kind == "module":
            out.append(mod)
            continue
        text = tree._text(rel)
        if not text or not _may_define(text, name, kind == "top"):
            continue
        m = tree.module(mod)
        if m is None:
            continue
        if name in m.defs or (kind == "top" and name in m.assigns and name not in m.imports):
            out.append(mod)
    return sorted(out)


# -- the installed vLLM (runtime) ---------------------------------------------------------

_LOCK = threading.RLock()
_INSTALLED: Relocation | None = None
LAST: dict = {}          # how the last installed() was answered: {"cache": "hit"|"miss"|"off", "ms": ...}


def installed(refresh: bool = False) -> Relocation:
    """The installed vLLM's relocation, resolved once per process from its files (no import).

    Cached per install (``install_cache`` kind "relocate"): the entry records every file the
    answer was read from (a search reads every file and directory of the tree), so any change
    to them recomputes; other processes of the same install reuse it after a few stats."""
    global _INSTALLED
    import time

    with _LOCK:
        if _INSTALLED is not None and not refresh:
            return _INSTALLED
        t0 = time.perf_counter()
        from . import install_cache

        root = install_cache.vllm_root()
        if root is None:
            _INSTALLED = Relocation()
            for s in SURFACE:
                _INSTALLED.locations[s.key] = Location(s.key, s.module, s.qualname, KNOWN)
            return _INSTALLED
        ident = install_cache.identity(root, what="relocate")
        data = install_cache.load("relocate", ident)
        if data is not None:
            _INSTALLED = from_dict(data)
            LAST.update(cache="hit", ms=(time.perf_counter() - t0) * 1e3)
            return _INSTALLED
        from .compat.source import DirReader, Tree
        from .compat.view import StaticView

        view = StaticView(Tree(DirReader(root)))
        searched: list[str] = []

        def search(name: str, kind: str) -> list[str]:
            searched.append(name)
            return static_search(view, name, kind)

        with install_cache.recording() as read:
            _INSTALLED = relocate(view, SURFACE, search=search)
        # a binding-site lookup (relocate_site) greps the tree too: that is a search as well
        grepped = bool(searched) or bool(getattr(view.tree.reader, "_grep", None))
        install_cache.store("relocate", ident, depends_on(_INSTALLED, root, read, grepped),
                            to_dict(_INSTALLED))
        LAST.update(cache="miss" if install_cache.enabled() else "off", ms=(time.perf_counter() - t0) * 1e3)
        return _INSTALLED


def depends_on(rel: Relocation, root, read: set[str], searched: bool) -> list[str]:
    """The paths whose stamps keep a cached relocation valid.

    Without a search: every file the resolution read (a handful).  With one (something
    moved): the files of every module named in the answer, old and new paths (absent ones
    stay recorded as absent), plus every directory of the tree (a file added, removed or
    renamed anywhere changes its directory's stamp), NOT every file: validating ~3000 file
    stamps at each load would cost ~35 ms; a duplicate definition added by editing an
    existing, unrelated file in place is therefore only noticed with the next vLLM version
    or any added/removed file (documented in docs/compat.md)."""
    from .compat.source import module_paths

    if not searched:
        return sorted(read)
    root = Path(root)
    out: set[str] = set()
    for loc in rel.locations.values():
        for mod in {loc.module, loc.old or loc.module, *loc.candidates}:
            out.update(str(root / rel_) for rel_ in module_paths(mod))
    for site_list in rel.sites.values():
        for mod in site_list:
            out.update(str(root / rel_) for rel_ in module_paths(mod))
    for dirpath, dirnames, _ in os.walk(root / "vllm"):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
        out.add(dirpath)
    return sorted(out)


def to_dict(rel: Relocation) -> dict:
    return {"locations": {k: dataclasses.asdict(v) for k, v in rel.locations.items()},
            "sites": {k: list(v) for k, v in rel.sites.items()}}


def from_dict(data: dict) -> Relocation:
    rel = Relocation()
    for k, v in data["locations"].items():
        v = dict(v, candidates=tuple(v.get("candidates", ())))
        rel.locations[k] = Location(**v)
    rel.sites = {k: tuple(v) for k, v in data.get("sites", {}).items()}
    return rel


def where(key: str) -> Symbol:
    """Registry entry ``key`` at its current home in the installed vLLM (for patches)."""
    try:
        return installed().symbol(key)
    except Exception as exc:   # resolution must never take the plugin down: the registry's path
        logger.debug("vllm_padplugin: relocation of %s failed: %s", key, exc)
        from .surface import get

        return get(key)


def module_of(key: str) -> str:
    return where(key).module


def reset() -> None:
    """Forget this process's resolution (tests)."""
    global _INSTALLED
    with _LOCK:
        _INSTALLED = None
