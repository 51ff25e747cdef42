"""Signature helpers for wrapping upstream functions whose parameters change between releases.

Same idea as vllm-spyre's ``compat_utils.has_argument``: ask the installed function
what it accepts instead of pinning versions.  Also reads a function's signature from
source text WITHOUT importing it (ast), so parity can be checked against every
released vLLM without installing one.  No vLLM import here.
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any, Callable

P = inspect.Parameter


def has_argument(func: Callable, name: str) -> bool:
    """True when ``func`` declares a parameter ``name`` (not via ``**kwargs``)."""
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def has_var_keyword(func_or_sig: Callable | inspect.Signature) -> bool:
    sig = func_or_sig if isinstance(func_or_sig, inspect.Signature) else _sig(func_or_sig)
    return sig is not None and any(p.kind is P.VAR_KEYWORD for p in sig.parameters.values())


def _sig(func: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def innermost(func: Callable) -> Callable:
    """Follow ``__wrapped__`` (functools.wraps) to the function that does the work."""
    seen = set()
    while id(func) not in seen:
        seen.add(id(func))
        try:
            nxt = func.__wrapped__
        except Exception:  # AttributeError, or a lazy placeholder raising something else
            return func
        func = nxt
    return func


def accepts_kwarg(func: Callable, name: str) -> bool:
    """Whether calling ``func(name=...)`` reaches code that knows ``name``.

    A declared parameter counts.  ``**kwargs`` counts only when the function it
    wraps (``__wrapped__`` chain) declares ``name``: a generic ``(*a, **kw)``
    wrapper around a factory without the parameter would still fail inside.
    """
    if has_argument(func, name):
        return True
    if has_var_keyword(func):
        inner = innermost(func)
        return inner is not func and accepts_kwarg(inner, name)
    return False


def with_parameter(sig: inspect.Signature, name: str, default: Any, annotation: Any = P.empty) -> inspect.Signature:
    """``sig`` plus a parameter ``name=default`` when it lacks one (unchanged otherwise).

    Placed last, before ``**kwargs``; keyword-only when ``*args`` or keyword-only
    parameters precede it (the only valid spot), positional-or-keyword otherwise.
    """
    if name in sig.parameters:
        return sig
    params = list(sig.parameters.values())
    var_kw = [p for p in params if p.kind is P.VAR_KEYWORD]
    rest = [p for p in params if p.kind is not P.VAR_KEYWORD]
    kw_only = any(p.kind in (P.VAR_POSITIONAL, P.KEYWORD_ONLY) for p in rest)
    kind = P.KEYWORD_ONLY if kw_only else P.POSITIONAL_OR_KEYWORD
    new = P(name, kind, default=default, annotation=annotation)
    return sig.replace(parameters=rest + [new] + var_kw)


def split_call(sig: inspect.Signature, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """Bind a call against ``sig`` (TypeError like a real call) and return it as
    (positional-only + *args values, every other given argument by name)."""
    bound = sig.bind(*args, **kwargs)
    pos: list = []
    kw: dict = {}
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind is P.POSITIONAL_ONLY:
            pos.append(value)
        elif kind is P.VAR_POSITIONAL:
            pos.extend(value)
        elif kind is P.VAR_KEYWORD:
            kw.update(value)
        else:
            kw[name] = value
    return pos, kw


# ---------------------------------------------------------------- from source


class SourceDefault:
    """A default value read from source that is not a literal; compares by its text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SourceDefault) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def _default(node: ast.expr | None) -> Any:
    if node is None:
        return P.empty
    try:
        return ast.literal_eval(node)
    except ValueError:
        return SourceDefault(ast.unparse(node))


def find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The (possibly nested in classes) definition ``qualname`` at module level."""
    body: list[ast.stmt] = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        found = None
        for node in body:
            last = i == len(parts) - 1
            if last and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == part:
                found = node
            elif not last and isinstance(node, ast.ClassDef) and node.name == part:
                found = node
        if found is None:
            return None
        body = getattr(found, "body", [])
        if i == len(parts) - 1:
            return found  # type: ignore[return-value]
    return None


def signature_from_def(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> inspect.Signature:
    """inspect.Signature of a parsed ``def``: annotations as source strings, literal defaults."""
    a = fn.args
    params: list[P] = []

    def ann(node: ast.expr | None) -> Any:
        return P.empty if node is None else ast.unparse(node)

    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, d) in enumerate(zip(positional, defaults)):
        kind = P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        params.append(P(arg.arg, kind, default=_default(d), annotation=ann(arg.annotation)))
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL, annotation=ann(a.vararg.annotation)))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=_default(d), annotation=ann(arg.annotation)))
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD, annotation=ann(a.kwarg.annotation)))
    return inspect.Signature(params, return_annotation=ann(fn.returns))


def signature_from_source(path: str | Path, qualname: str) -> inspect.Signature:
    """Signature of ``qualname`` defined in the Python file ``path``, read without importing.

    LookupError when the file has no such definition (the symbol moved).
    """
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    fn = find_function(tree, qualname)
    if fn is None:
        raise LookupError(f"{qualname} is not defined in {path}")
    return signature_from_def(fn)


def fake_function(sig: inspect.Signature, name: str, body: Callable[..., Any]) -> Callable:
    """A real function with signature ``sig`` whose calls go to ``body(**bound.arguments)``.

    Used to stand in for a released or future factory whose module cannot be
    imported here; ``inspect.signature`` and TypeError on bad calls behave like the real one.
    """

    def fake(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return body(**bound.arguments)

    fake.__name__ = fake.__qualname__ = name
    fake.__signature__ = sig  # type: ignore[attr-defined]
    return fake
