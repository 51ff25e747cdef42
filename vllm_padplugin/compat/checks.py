"""The drift classes, run over the registry (``surface.SURFACE``) against a view of one vLLM.

Each ``check_*`` is one drift class and returns ``Finding``s; ``check_surface`` applies
them to our own plugin's registry, ``plugin_scan`` to another plugin's discovered
surface.  Severity is about the plugin being checked: "breaking" means it fails or
silently stops masking; "info" means it keeps working (our backport or runtime
rebinding covers it) but a maintainer should know.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ..surface import SURFACE, Finding, Kind, Symbol, Use
from .sigdiff import Param, accepts, diff, format_params

# kinds (stable strings: JSON consumers and tests rely on them)
MODULE_REMOVED = "module-removed"
SYMBOL_REMOVED = "symbol-removed"
SYMBOL_MOVED = "symbol-moved"
LAZY_SHIM = "module-lazy-shim"
PARAM_REMOVED = "param-removed"
PARAM_RENAMED = "param-renamed"
PARAM_REQUIRED = "param-made-required"
PARAM_ADDED = "param-added"
OVERRIDE_MISSING = "override-missing-param"
NEW_BINDING_SITE = "new-binding-site"
ABSTRACT_MISSING = "abstract-method-missing"
READONLY_PROPERTY = "readonly-property"
PROPAGATION_LOST = "propagation-lost"
ENV_REMOVED = "env-removed"
ENV_DEFAULT = "env-default-changed"
NATIVE_MODE = "native-masking"


def _f(kind, symbol, detail, severity, fix, key="", item="", **extra) -> Finding:
    ex = {"item": item} if item else {}
    ex.update(extra)
    return Finding(kind=kind, symbol=symbol, detail=detail, severity=severity, fix=fix, key=key, extra=ex)


def check_presence(view, module: str, qualname: str, *, optional=False, moved_to=(), use="read",
                   key="", lazy_ok=False) -> tuple[list[Finding], object]:
    """Module/symbol removed or moved, or a lazy forwarding shim in the way of patching.
    ``lazy_ok``: the name is provided by the module's ``__getattr__`` by design (read only)."""
    path = f"{module}.{qualname}" if qualname else module
    out: list[Finding] = []
    head = qualname.split(".")[0] if qualname else ""
    if lazy_ok and head and view.has_module(module) and view.lazy_module(module):
        return out, True
    moved = [m for m in moved_to if view.lookup(*m.split(":", 1)) is not None]
    if not view.has_module(module) or (head and view.lookup(module, qualname) is None):
        missing_mod = not view.has_module(module)
        if optional or moved:
            where = f"; now at {', '.join(moved)}" if moved else ""
            out.append(_f(SYMBOL_REMOVED if not moved else SYMBOL_MOVED, path,
                          f"{('module ' + module) if missing_mod else path} is gone{where}; "
                          "the plugin treats it as optional", "info",
                          "Nothing to do: the optional patch is skipped on this vLLM.", key, moved_to=moved))
            return out, None
        # lazy forwarding module: attribute access may still work, patching does not
        if not missing_mod and head and view.lazy_module(module) and not view.defined_here(module, head):
            sev = "breaking" if use in ("wrap", "rebind", "assign") else "info"
            out.append(_f(LAZY_SHIM, path, f"{module} is now a lazy forwarding shim (module __getattr__) "
                          f"and no longer defines {head}; assigning into it does not reach the real module",
                          sev, f"Patch {head} where it is defined now (follow the shim's __getattr__) "
                          "and rebind its binding sites.", key))
            return out, None
        # where did it go?  (the last part: a function/class name, or the module's symbol)
        found = qualname.split(".")[-1]
        cands = view.find_definitions(found) if head else []
        if not cands and "." in qualname:
            found = head
            cands = view.find_definitions(head)
        cands = [c for c in cands if c != module]
        if cands:
            out.append(_f(SYMBOL_MOVED, path, f"{path} no longer exists; {found} is now defined in "
                          f"{', '.join(cands)}", "breaking",
                          f"Point the plugin (and its registry entry) at {cands[0]}.{found}.", key,
                          moved_to=cands))
        elif missing_mod:
            out.append(_f(MODULE_REMOVED, path, f"module {module} is gone", "breaking",
                          "Find the new home of the module's contents and update the plugin.", key))
        else:
            out.append(_f(SYMBOL_REMOVED, path, f"{qualname} is no longer defined in {module}", "breaking",
                          "Adapt the plugin to its replacement, or drop the patch.", key))
        return out, None
    if not head and view.lazy_module(module) and use in ("wrap", "rebind", "assign"):
        out.append(_f(LAZY_SHIM, path, f"{module} defines a module __getattr__ (lazy forwarding); names it "
                      "forwards are not reachable by assigning into it", "breaking",
                      "Patch the module that really defines the names.", key))
    return out, (view.lookup(module, qualname) if head else True)


def check_params(path: str, params: list[Param], need: Iterable[str], *, backport=(), mode="native",
                 key="") -> list[Finding]:
    """Parameters the plugin passes or relies on, missing upstream (removed or renamed)."""
    out = []
    for p in need:
        if accepts(params, p):
            continue
        if p in backport:
            sev = "info" if mode == "backport" else "breaking"
            out.append(_f(PARAM_REMOVED, path, f"{path} has no parameter {p!r}; the plugin's backport "
                          f"supplies it ({mode} mode)", sev,
                          "Nothing to do: the backport covers this vLLM." if sev == "info" else
                          f"Upstream dropped {p!r} while native masking is assumed: re-enable the backport.",
                          key, item=p))
        else:
            out.append(_f(PARAM_REMOVED, path, f"{path} no longer accepts {p!r} (removed or renamed); "
                          f"signature is {format_params(params)}", "breaking",
                          f"Stop passing {p!r} or map it to its new name.", key, item=p))
    return out


def check_required(path: str, params: list[Param], passed: Iterable[str], key="") -> list[Finding]:
    """Parameters that are required upstream but the plugin does not pass (TypeError)."""
    passed = set(passed)
    return [_f(PARAM_REQUIRED, path, f"{path} now requires {p.name!r}, which the plugin does not pass",
               "breaking", f"Pass {p.name}= (see upstream default/meaning).", key, item=p.name)
            for p in params if p.required and p.name not in passed]


def check_override(view, module: str, name: str, replacement: list[Param], *, who: str,
                   key="") -> list[Finding]:
    """The vllm-gaudi TypeError: a replacement lacks a keyword that upstream callers pass."""
    out, seen = [], set()
    for site, calls in view.callers(module, name).items():
        for line, kws, _ in calls:
            for kw in sorted(kws):
                if kw in seen or accepts(replacement, kw):
                    continue
                seen.add(kw)
                out.append(_f(OVERRIDE_MISSING, f"{module}.{name}",
                              f"{who} replaces {name} with {format_params(replacement)}, but upstream "
                              f"{site} (line {line}) calls it with {kw}=: TypeError when that call runs",
                              "breaking", f"Add `{kw}` to {who}'s signature (and pass it through to the "
                              "original), or accept **kwargs and forward them.", key, item=kw, caller=site))
    return out


def check_binding_sites(view, module: str, name: str, known: Iterable[str], *, handled: bool,
                        key="") -> list[Finding]:
    """Modules that import the patched function by name and are not in the known list."""
    known = set(known)
    out = []
    for site in view.binding_sites(module, name):
        if site in known:
            continue
        out.append(_f(NEW_BINDING_SITE, f"{site}.{name}",
                      f"{site} imports {name} by name: a patch of {module}.{name} does not reach it "
                      "unless that site is rebound", "info" if handled else "breaking",
                      "Nothing to do: runtime rebinding covers every module that imports it by name; "
                      "add the site to the registry's known sites." if handled else
                      f"Also rebind {site}.{name} (or rebind every module holding the original object).",
                      key, item=site))
    return out


def check_abstract(view, module: str, qualname: str, implemented: Iterable[str], *, who: str,
                   key="") -> list[Finding]:
    abstract = view.abstract_methods(module, qualname)
    if not abstract:
        return []
    missing = sorted(set(abstract) - set(implemented))
    return [_f(ABSTRACT_MISSING, f"{module}.{qualname}.{m}",
               f"{who} derives from {qualname} but does not implement its abstract method {m!r}: "
               "instantiation raises TypeError", "breaking", f"Implement {m}() in {who}.", key, item=m)
            for m in missing]


def check_assign(view, module: str, qualname: str, *, who: str, key="") -> list[Finding]:
    info = view.lookup(module, qualname)
    if info is not None and info.kind == "property" and info.readonly:
        return [_f(READONLY_PROPERTY, f"{module}.{qualname}",
                   f"{who} assigns {qualname}, now a read-only property upstream: AttributeError",
                   "breaking", "Stop assigning it; override the property in a subclass or set the "
                   "attributes it is computed from.", key)]
    return []


def check_propagation(view, module: str, qualname: str, callee: str, params: Iterable[str], *,
                      backport=(), mode="native", key="") -> list[Finding]:
    calls = view.call_kwargs(module, qualname, callee)
    if calls is None:
        return []     # presence is checked separately
    path = f"{module}.{qualname}"
    out = []
    for p in params:
        ok = bool(calls) and all(p in kws or star for _, kws, star in calls)
        if ok:
            continue
        lines = ", ".join(str(line) for line, kws, star in calls if p not in kws and not star) or "none"
        sev = "info" if (p in backport and mode == "backport") else "breaking"
        out.append(_f(PROPAGATION_LOST, path, f"{callee}() called in {qualname} without {p}= "
                      f"(calls at lines {lines}): micro-batch forward contexts lose the padding mask",
                      sev, "Nothing to do: the backport slices is_padding into each micro-batch context."
                      if sev == "info" else f"Pass {p}= (sliced to the micro-batch) to {callee}() in "
                      f"{qualname}, or patch it in the plugin.", key, item=p))
    return out


def check_env(view, name: str, default: str | None, *, key="", module: str = "vllm.envs") -> list[Finding]:
    present, upstream_default = view.env_default(name, module)
    if not present:
        return [_f(ENV_REMOVED, f"vllm.envs.{name}", f"{name} is no longer declared in vllm/envs.py",
                   "breaking", f"Read {name} directly from os.environ (keeping its old default) or follow "
                   "its replacement.", key)]
    if default is not None and upstream_default is not None and upstream_default != default:
        return [_f(ENV_DEFAULT, f"vllm.envs.{name}", f"{name} default changed: {default!r} -> "
                   f"{upstream_default!r}", "breaking",
                   "Confirm the new default is intended; update the plugin's registry default.", key,
                   old=default, new=upstream_default)]
    return []


# -- our own registry ---------------------------------------------------------

def masking_mode(view, relocation=None) -> str:
    """'native' when upstream's factory and GroupedTopKRouter both take skip_padding, else 'backport'."""
    lookup = getattr(view, "upstream_lookup", view.lookup)   # runtime: upstream's, not our wrapper
    if relocation is None:
        relocation = relocation_for(view)
    for key in ("router_factory", "grouped_topk_router"):
        s = relocation.symbol(key)
        info = lookup(s.module, s.qualname)
        if info is None or info.params is None or not accepts(info.params, "skip_padding"):
            return "backport"
    return "native"


@dataclass
class Baseline:
    """What the last-good vLLM looked like (``--git``): signatures and binding sites per key."""

    params: dict[str, list[Param]] = field(default_factory=dict)
    sites: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, view, surface: Iterable[Symbol] = SURFACE) -> "Baseline":
        b = cls()
        for s in surface:
            if s.kind in (Kind.FUNCTION, Kind.METHOD, Kind.CLASS) and s.params and view.has_module(s.module):
                info = view.lookup(s.module, s.qualname)
                if info is not None and info.params is not None:
                    b.params[s.key] = info.params
            if s.use == Use.REBIND and s.kind == Kind.FUNCTION:
                b.sites[s.key] = tuple(view.binding_sites(s.module, s.qualname))
        return b


def check_sig_change(path: str, old: list[Param], new: list[Param], s: Symbol, key="") -> list[Finding]:
    """Signature drift against the last-good signature (renamed, made required, added)."""
    d = diff(old, new)
    out = []
    for a, b in d.renamed:
        sev = "breaking" if (a in s.params or s.use == Use.CALL) else "info"
        out.append(_f(PARAM_RENAMED, path, f"parameter {a!r} of {path} renamed to {b!r}", sev,
                      f"Pass {b}= instead of {a}=." if sev == "breaking" else
                      "Nothing to do: the plugin mirrors the signature.", key, item=f"{a}->{b}"))
    for p in d.removed:
        if p not in s.params:
            out.append(_f(PARAM_REMOVED, path, f"parameter {p!r} of {path} removed upstream", "info",
                          "Nothing to do: the plugin does not pass it.", key, item=p))
    for p in d.made_required + d.added_required:
        sev = "breaking" if s.use == Use.CALL and p not in s.params else "info"
        out.append(_f(PARAM_REQUIRED, path, f"parameter {p!r} of {path} is now required", sev,
                      f"Pass {p}= where the plugin calls {s.qualname}." if sev == "breaking" else
                      "Nothing to do: callers pass it through the plugin's wrapper.", key, item=p))
    for p in d.added:
        out.append(_f(PARAM_ADDED, path, f"{path} gained parameter {p!r}", "info",
                      "Nothing to do: added parameters pass through the wrapper.", key, item=p))
    return out


def check_symbol(view, s: Symbol, mode: str, baseline: Baseline | None = None) -> list[Finding]:
    out, info = check_presence(view, s.module, s.qualname, optional=s.optional, moved_to=s.moved_to,
                               use=s.use.value, key=s.key, lazy_ok=s.lazy)
    if info is None:
        return out
    path = s.path
    # params only when the entry lists some: reading them may parse a big file (the legacy runner)
    params = getattr(info, "params", None) if s.params else None
    if s.kind in (Kind.FUNCTION, Kind.METHOD, Kind.CLASS) and s.params and params is not None:
        out += check_params(path, params, s.params, backport=s.backport, mode=mode, key=s.key)
        if baseline is not None and s.key in baseline.params:
            out += check_sig_change(path, baseline.params[s.key], params, s, key=s.key)
    if s.use == Use.REBIND and s.kind == Kind.FUNCTION:
        known = baseline.sites.get(s.key, s.sites) if baseline is not None else s.sites
        out += check_binding_sites(view, s.module, s.qualname, known, handled=True, key=s.key)
    if s.use == Use.ASSIGN:
        out += check_assign(view, s.module, s.qualname, who="the plugin", key=s.key)
    if s.use == Use.SUBCLASS:
        out += check_abstract(view, s.module, s.qualname, s.params, who="the plugin's subclass", key=s.key)
    if s.kind == Kind.PROPAGATION:
        out += check_propagation(view, s.module, s.qualname, s.callee, s.params, backport=s.backport,
                                 mode=mode, key=s.key)
    return out


def check_surface(view, surface: Iterable[Symbol] = SURFACE, baseline: Baseline | None = None) -> list[Finding]:
    """Every drift class over the registry (the masking mode decides backport-covered severities).

    Each entry is first resolved where this vLLM keeps it now (``relocate``): a verified move
    is one info finding and the entry is checked at its new home; an ambiguous one is one
    breaking finding; a symbol found nowhere is reported as before (removed: breaking)."""
    from .. import relocate as _relocate

    rel = relocation_for(view, surface)
    mode = masking_mode(view, rel if rel.base == SURFACE else None)
    out: list[Finding] = rel.findings()
    for s in rel.surface():
        if rel.locations[s.key].status == _relocate.AMBIGUOUS:
            continue
        if s.kind == Kind.ENV:
            old = next(x for x in rel.base if x.key == s.key)
            out += check_env(view, s.qualname, s.default, key=s.key, module=s.module)
            if s.module != old.module:   # keep the stable symbol name of the env finding
                for f in out:
                    if f.key == s.key and f.kind in (ENV_REMOVED, ENV_DEFAULT):
                        f.extra.setdefault("moved_to", [s.module])
            continue
        out += check_symbol(view, s, mode, baseline)
    seen, uniq = set(), []
    for f in out:     # two registry entries may name one symbol (factory + its binding sites)
        i = (f.kind, f.symbol, str(f.extra.get("item", "")))
        if i not in seen:
            seen.add(i)
            uniq.append(f)
    return uniq


def relocation_for(view, surface: Iterable[Symbol] = SURFACE):
    """The relocation of ``surface`` on ``view``: the runtime view (the loaded vLLM) shares the
    process's one resolution of the installed vLLM (``relocate.installed``), static views
    resolve afresh."""
    from .. import relocate as _relocate

    surface = tuple(surface)
    if hasattr(view, "upstream_lookup") and surface == SURFACE:   # shim.RuntimeView
        return _relocate.installed()
    memo = view.__dict__.setdefault("_relocations", {})   # one resolution per view and surface
    if surface not in memo:
        prior = getattr(view, "prior_relocations", {}).get(surface)   # compat --git: a neighbour's
        memo[surface] = _relocate.relocate(view, surface, prior=prior)
    return memo[surface]
