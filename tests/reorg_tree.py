"""Build a "reorganised" vLLM tree from a release's (or an install's) sources.

vLLM main is moving its packages (stored snapshots of vllm-project/vllm, e.g. commits
055e47c28003156421365af985d676fc921cb075 and aedcda890b813c2a68618ce6b7547d2e5881dbde;
facts in tests/fixtures/reorg/main_facts.json).  ``MAIN_MOVES`` mirrors what they show;
``build(src_root, dest, moves)`` applies such a list to a copy:

- the moved module (file or package) is placed at its new path (new parent packages get an
  empty ``__init__.py``), every ``vllm.old.path`` reference in every file (imports,
  ``import_module`` strings, ``vllm.envs.X`` attribute chains) and the ``from vllm import
  old`` forms are rewritten to the new path;
- ``shim``: what is left at the old path: ``None`` (nothing: a clean move), ``"alias"``
  (``sys.modules[__name__] = import_module(new)``), ``"getattr"`` (a module ``__getattr__``
  forwarding to the new module): the two styles main's auto-generated shims use, or
  ``"reexport"`` (``from new import *``).

The copy is a symlink farm (``cp -rs``): only the files that change become real files, so a
copy of the installed package costs little and nothing is written into the venv
(the approach of tests/fault_driver.py).  ``__pycache__`` directories are not carried.
Written for these tests; it moves upstream files, it contains no upstream code.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Move:
    old: str                  # dotted module path, e.g. "vllm.forward_context"
    new: str                  # e.g. "vllm.runtime.execution.forward_context"
    shim: str | None = None   # None | "alias" | "getattr" | "reexport"


# What vLLM main's snapshots show (see tests/fixtures/reorg/main_facts.json).
MAIN_MOVES = (
    Move("vllm.forward_context", "vllm.runtime.execution.forward_context"),
    Move("vllm.envs", "vllm.foundation.system.envs"),
    Move("vllm.platforms", "vllm.backends.platform"),
    Move("vllm.config", "vllm.foundation.config"),
    Move("vllm.distributed.eplb.eplb_state", "vllm.backends.distributed.eplb.eplb_state"),
)


def with_shims(moves, shim: str) -> tuple[Move, ...]:
    return tuple(Move(m.old, m.new, shim) for m in moves)


def _rel(module: str) -> str:
    return module.replace(".", "/")


def _is_pkg(root: Path, module: str) -> bool:
    return (root / _rel(module) / "__init__.py").is_file()


def _materialize(path: Path) -> None:
    if path.is_symlink():
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)


def copy_tree(src_root: Path, dest: Path) -> Path:
    """A symlink farm of ``src_root/vllm`` at ``dest/vllm`` (directories real, files links)."""
    dest.mkdir(parents=True, exist_ok=True)
    src_pkg = (Path(src_root) / "vllm").resolve()
    subprocess.run(["cp", "-rs", str(src_pkg), str(dest / "vllm")], check=True)
    for d in list((dest / "vllm").rglob("__pycache__")):
        shutil.rmtree(d, ignore_errors=True)
    _materialize(dest / "vllm" / "__init__.py")   # vllm.__file__ resolves into the copy
    return dest


def _patterns(moves):
    """(regex, replacement) pairs, longest old path first (``vllm.config`` after deeper ones)."""
    out = []
    for m in sorted(moves, key=lambda m: -len(m.old)):
        out.append((re.compile(rf"(?<![\w.]){re.escape(m.old)}\b(?!\w)"), m.new))
    return out


def _from_vllm_import(line: str, moved: dict[str, str]) -> str:
    """``from vllm import envs, ir`` -> ``from vllm.foundation.system import envs`` + ``from vllm import ir``."""
    m = re.match(r"^(\s*)from vllm import ([\w, ]+?)(\s*(#.*)?)$", line)
    if not m:
        return line
    indent, names = m.group(1), [n.strip() for n in m.group(2).split(",") if n.strip()]
    keep, lines = [], []
    for n in names:
        base, _, alias = n.partition(" as ")
        base, alias = base.strip(), (alias.strip() or base.strip())
        new = moved.get(f"vllm.{base}")
        if new is None:
            keep.append(n)
            continue
        parent, _, leaf = new.rpartition(".")
        lines.append(f"{indent}from {parent} import {leaf}" + (f" as {alias}" if alias != leaf else ""))
    if not lines:
        return line
    if keep:
        lines.insert(0, f"{indent}from vllm import {', '.join(keep)}")
    return "\n".join(lines)


def _absolute_imports(text: str, pkg: str) -> str:
    """``from .x import y`` in a module of ``pkg`` -> ``from pkg.x import y`` (a moved single
    file keeps importing its old neighbours)."""
    def sub(m):
        dots, rest = m.group(2), m.group(3)
        parts = pkg.split(".")
        base = ".".join(parts[: len(parts) - (len(dots) - 1)])
        return f"{m.group(1)}from {base}{'.' + rest if rest else ''} import"
    return re.sub(r"^(\s*)from (\.+)([\w.]*) import", sub, text, flags=re.M)


def rewrite(text: str, moves) -> str:
    pats = _patterns(moves)
    moved = {m.old: m.new for m in moves}
    out_lines = []
    for line in text.split("\n"):
        if "from vllm import" in line:
            line = _from_vllm_import(line, moved)
        if "vllm." in line:
            for rx, new in pats:
                line = rx.sub(new, line)
        out_lines.append(line)
    return "\n".join(out_lines)


# The two shim styles vLLM main's auto-generated old-path modules use (facts:
# tests/fixtures/reorg/main_facts.json "shim_styles_seen"), plus a plain re-export.
SHIMS = {
    "alias": ('"""Moved to {new} (forwarding shim: sys.modules alias)."""\n'
              "import importlib\nimport sys\n\n_real = importlib.import_module({new!r})\n"
              "sys.modules[__name__] = _real\n"),
    "getattr": ('"""Moved to {new} (forwarding shim: lazy __getattr__ delegation)."""\n'
                "import importlib as _importlib\n\n_real = _importlib.import_module({new!r})\n\n\n"
                "def __getattr__(name):\n    return getattr(_real, name)\n"),
    "reexport": ('"""Moved to {new} (forwarding shim: re-exports the new module)."""\n'
                 "from {new} import *  # noqa: F401,F403\n"),
}


def build(src_root: str | os.PathLike, dest: str | os.PathLike, moves=MAIN_MOVES) -> Path:
    """Reorganised copy of ``src_root`` (a directory holding ``vllm/``) at ``dest``; returns ``dest``."""
    src_root, dest = Path(src_root), Path(dest)
    copy_tree(src_root, dest)
    pkg_moves = []
    for m in moves:   # 1. move files / packages (before rewriting, so rewriting sees final paths)
        old_p, new_p = dest / _rel(m.old), dest / _rel(m.new)
        is_pkg = _is_pkg(dest, m.old)
        new_p.parent.mkdir(parents=True, exist_ok=True)
        parts = m.new.split(".")
        for i in range(2, len(parts)):
            init = dest.joinpath(*parts[:i], "__init__.py")
            if not init.exists():
                init.write_text("")
        if is_pkg:
            shutil.move(str(old_p), str(new_p))
            pkg_moves.append(m)
        else:
            src = old_p.with_suffix(".py")
            text = _absolute_imports(src.read_text(), m.old.rpartition(".")[0])
            src.unlink()
            new_p.with_suffix(".py").write_text(text)
    # 2. rewrite references in every file (materialising only the ones that change)
    words = [m.old for m in moves] + ["from vllm import"]
    for path in (dest / "vllm").rglob("*.py"):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if not any(w.encode() in data for w in words):
            continue
        text = data.decode("utf-8", errors="surrogateescape")
        new = rewrite(text, moves)
        if new != text:
            path.unlink()
            path.write_bytes(new.encode("utf-8", errors="surrogateescape"))
    # 3. shims at the old paths
    for m in moves:
        if m.shim is None:
            continue
        body = SHIMS[m.shim].format(new=m.new)
        if m in pkg_moves:
            (dest / _rel(m.old)).mkdir(parents=True, exist_ok=True)
            (dest / _rel(m.old) / "__init__.py").write_text(body)
        else:
            (dest / _rel(m.old)).with_suffix(".py").write_text(body)
    return dest


SECOND_MOE_PATH = Path(__file__).resolve().parent / "fixtures" / "compat" / "drift" / "second_moe_path"


def add_second_moe_path(dest: str | os.PathLike) -> None:
    """Add a second MoE path like vLLM main's ``vllm/model_executor/hw_agnostic`` (its own
    ``create_fused_moe_router`` and a ``fused_moe/layer.py`` importing it; test-written files)."""
    for f in SECOND_MOE_PATH.rglob("*.py"):
        t = Path(dest) / f.relative_to(SECOND_MOE_PATH)
        t.parent.mkdir(parents=True, exist_ok=True)
        t.write_text(f.read_text())


def remove_symbol(root: str | os.PathLike, module: str, name: str, new_name: str) -> None:
    """Really remove a symbol: rename its definition (and every use) in the whole tree."""
    root = Path(root)
    rx = re.compile(rf"\b{re.escape(name)}\b")
    for path in (root / "vllm").rglob("*.py"):
        data = path.read_bytes()
        if name.encode() not in data:
            continue
        text = data.decode("utf-8", errors="surrogateescape")
        path.unlink()
        path.write_bytes(rx.sub(new_name, text).encode("utf-8", errors="surrogateescape"))


if __name__ == "__main__":   # python tests/reorg_tree.py SRC_ROOT DEST [alias|getattr|reexport]
    moves = with_shims(MAIN_MOVES, sys.argv[3]) if len(sys.argv) > 3 else MAIN_MOVES
    print(build(sys.argv[1], sys.argv[2], moves))
