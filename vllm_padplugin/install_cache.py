"""A small on-disk cache of facts derived from the installed vLLM's files, per install.

Used at plugin load (the drift check's static answers, kind ``"drift"``) and by the
symbol-relocation search (kind ``"relocate"``), so that only the first of vLLM's many
processes (front end, engine core, every worker) reads and parses vLLM sources; the
others check a few file stamps and reuse the answer.  Nothing here imports vLLM.

API (all functions are safe to call when the cache is disabled or unwritable: a miss,
never an exception)::

    ident = identity(vllm_root)                 # what identifies this install + this plugin
    data = load("drift", ident)                 # dict, or None (miss / stale / disabled)
    if data is None:
        with recording() as files:              # every path note()d while computing
            data = compute()                    # readers call note(path) for what they read
        store("drift", ident, files, data)

``note(*paths)`` records dependencies into every active ``recording()`` of this thread
(they nest); a ``load`` hit notes its entry's files, so a cache computed on top of another
cache inherits that one's dependencies.

Validity: an entry is returned only when (1) its identity equals ``ident`` (vLLM root path,
vLLM version, Python, plugin version + package dir + a stamp of the plugin's own .py files,
surface-registry hash, plus whatever ``extra`` the caller adds) and (2) every file recorded
at ``store`` time still has the same stamp ``(mtime_ns, size, inode, ctime_ns)`` (following
symlinks), and every file recorded as absent is still absent.  So an edited, replaced,
added or removed vLLM file invalidates the entry, and the next load recomputes.

"Racy" files (modified less than ``RACY_S`` seconds before ``store``) are a reason not to
store: a same-size edit within the file system's timestamp granularity could otherwise
keep a stale stamp (git's "racy clean" problem).

Concurrency: ``store`` writes a private temporary file in the entry's directory and
``os.replace``s it into place, so readers see the old entry, the new one, or none, never a
torn file; many processes storing at once all succeed (last one wins, same content).
A corrupt entry reads as a miss.  The directory is bounded: after a store, entries beyond
``MAX_ENTRIES`` (oldest first) or ``MAX_BYTES`` per kind are removed.

Location: ``$PADPLUGIN_CACHE/install/<kind>/`` (default ``~/.cache/vllm_padplugin``);
``PADPLUGIN_INSTALL_CACHE=0`` turns the cache off (every load recomputes).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable

CACHE_ENV = "PADPLUGIN_CACHE"            # root of all of the plugin's caches
SWITCH_ENV = "PADPLUGIN_INSTALL_CACHE"   # "0" / "off": disabled
FORMAT = 1                               # bump when the entry layout changes
MAX_ENTRIES = 32                         # per kind
MAX_BYTES = 16 << 20                     # per kind
RACY_S = 2.0

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_OFF = ("0", "false", "no", "off")


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in _OFF


def cache_root() -> Path:
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "vllm_padplugin")
    return Path(base) / "install"


def kind_dir(kind: str) -> Path:
    if not kind or not kind.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"bad cache kind {kind!r}")
    return cache_root() / kind


# ---------------------------------------------------------------- dependencies

_REC = threading.local()


@contextlib.contextmanager
def recording():
    """Collect (as a set of path strings) every path ``note``d in this thread meanwhile."""
    stack = getattr(_REC, "stack", None)
    if stack is None:
        stack = _REC.stack = []
    files: set[str] = set()
    stack.append(files)
    try:
        yield files
    finally:
        stack.remove(files)


def recording_active() -> bool:
    """Whether a ``recording()`` is open in this thread (callers skip costly ``note``s otherwise)."""
    return bool(getattr(_REC, "stack", None))


def note(*paths: str | os.PathLike) -> None:
    """Declare that the answer being computed depends on ``paths`` (files or directories)."""
    stack = getattr(_REC, "stack", None)
    if stack:
        names = [os.fspath(p) for p in paths]
        for files in stack:
            files.update(names)


# ---------------------------------------------------------------- stamps

def stamp(path: str | os.PathLike) -> list[int] | None:
    """``[mtime_ns, size, inode, ctime_ns]`` of ``path`` (symlinks followed), None if absent."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns]


def _code_stamp(pkg_dir: str = _PKG_DIR) -> str:
    """Hash of the stamps of the plugin's own .py files: a dev checkout edited in place
    (same version number) must not be served answers its old code computed."""
    h = hashlib.blake2b(digest_size=12)
    for dirpath, dirnames, filenames in os.walk(pkg_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
        for name in sorted(filenames):
            if name.endswith(".py"):
                p = os.path.join(dirpath, name)
                h.update(f"{p}\0{stamp(p)}\n".encode())
    return h.hexdigest()


def surface_hash() -> str:
    """Hash of the plugin's surface registry (what the drift check checks)."""
    from vllm_padplugin.surface import SURFACE

    return hashlib.blake2b(repr(SURFACE).encode(), digest_size=12).hexdigest()


def _vllm_version(root: Path) -> str | None:
    mod = sys.modules.get("vllm")
    version = getattr(mod, "__version__", None) if mod is not None else None
    file = getattr(mod, "__file__", None) or ""
    if version and os.path.realpath(file).startswith(str(root) + os.sep):   # the imported vLLM is this one
        return str(version)
    try:  # generated at build time; read, not imported
        text = (root / "vllm" / "_version.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("__version__", "version")) and "=" in line:
            return line.split("=", 1)[1].strip().strip("'\"")
    return None


def identity(vllm_root: str | os.PathLike, **extra: Any) -> dict[str, Any]:
    """What identifies one vLLM install as seen by this plugin build (JSON-able dict).

    ``vllm_root`` is the directory holding the ``vllm`` package.  ``extra`` (JSON-able)
    is added as is, e.g. a parameter of the cached computation.
    """
    from vllm_padplugin import __version__

    root = Path(vllm_root).resolve()
    return {
        "format": FORMAT,
        "vllm_root": str(root),
        "vllm_init": stamp(root / "vllm" / "__init__.py"),
        "vllm_version": _vllm_version(root),
        "python": f"{sys.implementation.cache_tag} {sys.version.split()[0]} {sys.executable}",
        "plugin_version": __version__,
        "plugin_dir": _PKG_DIR,
        "plugin_code": _code_stamp(),
        "surface": surface_hash(),
        **extra,
    }


def vllm_root() -> Path | None:
    """Directory holding the ``vllm`` package (of the imported one if imported), found
    without importing it; None when vLLM is not installed."""
    mod = sys.modules.get("vllm")
    if mod is not None and getattr(mod, "__file__", None):
        return Path(mod.__file__).resolve().parent.parent
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def digest(data: Any) -> str:
    """Short stable hash of JSON-able ``data`` (entry names; a computation's inputs in an identity)."""
    return hashlib.blake2b(json.dumps(data, sort_keys=True, default=str).encode(), digest_size=12).hexdigest()




def entry_path(kind: str, ident: dict[str, Any]) -> Path:
    return kind_dir(kind) / f"{digest(ident)}.json"


# ---------------------------------------------------------------- load / store

def load(kind: str, ident: dict[str, Any], files: Iterable[str | os.PathLike] = ()) -> dict | None:
    """The data stored for ``ident``, or None when disabled, absent, corrupt or stale.

    Stale = any file recorded at store time changed stamp (or appeared / disappeared).
    ``files``: paths the caller needs covered; an entry that did not record all of them
    is a miss too.
    """
    if not enabled():
        return None
    try:
        with open(entry_path(kind, ident), encoding="utf-8") as fh:
            entry = json.load(fh)
        if entry.get("identity") != json.loads(json.dumps(ident, default=str)):
            return None
        recorded = entry["files"]
        if any(os.fspath(f) not in recorded for f in files):
            return None
        for path, st in recorded.items():
            if stamp(path) != st:
                return None
        data = entry["data"]
        if not isinstance(data, dict):
            return None
        note(*recorded)
        return data
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store(kind: str, ident: dict[str, Any], files: Iterable[str | os.PathLike], data: dict) -> bool:
    """Record ``data`` (JSON-able dict) for ``ident``, valid while ``files`` keep their stamps.

    Returns whether an entry was written (False: disabled, racy file, unwritable dir).
    Never raises for I/O problems.
    """
    if not enabled():
        return False
    now = time.time()
    stamps: dict[str, list[int] | None] = {}
    for f in sorted(os.fspath(p) for p in files):
        st = stamp(f)
        if st is not None and now - st[0] / 1e9 < RACY_S:
            return False      # modified just now: a same-size edit could keep this stamp
        stamps[f] = st
    d = kind_dir(kind)
    body = json.dumps({"identity": ident, "files": stamps, "data": data, "stored_at": now},
                      default=str, sort_keys=True)
    tmp = None
    try:
        import tempfile  # only when storing: not on a cache hit's path

        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=d)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body)
        os.replace(tmp, entry_path(kind, ident))
        tmp = None
        prune(kind)
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def prune(kind: str, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> int:
    """Remove the oldest entries of ``kind`` beyond the bounds (and stale temp files); returns
    how many were removed.  Races with other processes are harmless (missing files skipped)."""
    d = kind_dir(kind)
    entries = []
    removed = 0
    now = time.time()
    try:
        with os.scandir(d) as it:
            for e in it:
                try:
                    st = e.stat()
                except OSError:
                    continue
                if e.name.startswith(".tmp-"):
                    if now - st.st_mtime > 600:  # a process died mid-store
                        removed += _unlink(e.path)
                    continue
                if e.name.endswith(".json"):
                    entries.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return removed
    entries.sort(reverse=True)  # newest first
    total = 0
    for i, (_, size, path) in enumerate(entries):
        total += size
        if i >= max_entries or total > max_bytes:
            removed += _unlink(path)
    return removed


def _unlink(path: str) -> int:
    try:
        os.unlink(path)
        return 1
    except OSError:
        return 0


def clear(kind: str | None = None) -> int:
    """Remove every entry (of ``kind``, or of all kinds); for tests and ``--no-cache`` users."""
    root = cache_root()
    dirs = [root / kind] if kind else ([p for p in root.iterdir() if p.is_dir()] if root.is_dir() else [])
    return sum(_unlink(str(p)) for d in dirs if d.is_dir() for p in d.iterdir() if p.suffix == ".json")
