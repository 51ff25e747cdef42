"""Pure signature model and diff, shared by the static check and the runtime shim.

A ``Param`` is what both ``ast`` (static) and ``inspect`` (runtime) can tell about a
parameter, so the two paths run the very same comparison and cannot disagree.
"""
from __future__ import annotations

from dataclasses import dataclass

POSITIONAL_ONLY = "POSITIONAL_ONLY"
POSITIONAL_OR_KEYWORD = "POSITIONAL_OR_KEYWORD"
VAR_POSITIONAL = "VAR_POSITIONAL"
KEYWORD_ONLY = "KEYWORD_ONLY"
VAR_KEYWORD = "VAR_KEYWORD"


@dataclass(frozen=True)
class Param:
    name: str
    kind: str = POSITIONAL_OR_KEYWORD
    has_default: bool = False
    default: str | None = None   # source text of the default (static) or repr (runtime)

    @property
    def required(self) -> bool:
        return not self.has_default and self.kind not in (VAR_POSITIONAL, VAR_KEYWORD)


def names(params: list[Param]) -> list[str]:
    """Named parameters (no *args/**kwargs), in order."""
    return [p.name for p in params if p.kind not in (VAR_POSITIONAL, VAR_KEYWORD)]


def accepts_any_kwarg(params: list[Param]) -> bool:
    return any(p.kind == VAR_KEYWORD for p in params)


def accepts(params: list[Param], kwarg: str) -> bool:
    """Whether a call passing ``kwarg=`` binds (by name or through ``**kwargs``)."""
    for p in params:
        if p.name == kwarg and p.kind != POSITIONAL_ONLY and p.kind not in (VAR_POSITIONAL, VAR_KEYWORD):
            return True
    return accepts_any_kwarg(params)


def drop_self(params: list[Param]) -> list[Param]:
    if params and params[0].name in ("self", "cls") and params[0].kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD):
        return params[1:]
    return params


@dataclass(frozen=True)
class SigDiff:
    """How ``new`` differs from ``old``, as the names a caller of ``old`` cares about."""

    removed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    added_required: tuple[str, ...] = ()
    made_required: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()   # (old, new) at the same position

    @property
    def breaking(self) -> bool:
        return bool(self.removed or self.added_required or self.made_required or self.renamed)

    @property
    def empty(self) -> bool:
        return not (self.removed or self.added or self.added_required or self.made_required or self.renamed)


def diff(old: list[Param], new: list[Param]) -> SigDiff:
    """Compare two signatures; a removed+added pair at the same position is a rename."""
    o, n = {p.name: p for p in old}, {p.name: p for p in new}
    on, nn = names(old), names(new)
    removed = [x for x in on if x not in n]
    added = [x for x in nn if x not in o]
    renamed = []
    for r in list(removed):
        i = on.index(r)
        if i < len(nn) and nn[i] in added:
            renamed.append((r, nn[i]))
            removed.remove(r)
            added.remove(nn[i])
    if accepts_any_kwarg(new):
        removed = []   # still bind through **kwargs
    added_required = [x for x in added if n[x].required]
    made_required = [x for x in on if x in n and not o[x].required and n[x].required]
    return SigDiff(tuple(removed), tuple(x for x in added if x not in added_required),
                   tuple(added_required), tuple(made_required), tuple(renamed))


def format_params(params: list[Param]) -> str:
    out = []
    for p in params:
        pre = "*" if p.kind == VAR_POSITIONAL else "**" if p.kind == VAR_KEYWORD else ""
        out.append(pre + p.name + (f"={p.default}" if p.has_default and p.default is not None else ""))
    return "(" + ", ".join(out) + ")"
