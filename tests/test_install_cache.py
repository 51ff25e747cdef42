"""install_cache: identity, stamp validation, racy files, atomic concurrent stores, bounds.

Real files and real processes; no vLLM needed (the identity's root is any directory).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_padplugin import install_cache as ic

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PADPLUGIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PADPLUGIN_INSTALL_CACHE", raising=False)
    return tmp_path / "cache"


def _old_file(path: Path, text: str) -> Path:
    path.write_text(text)
    t = time.time() - 60
    os.utime(path, (t, t))   # not "racy": written a minute ago
    return path


def _install(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    _old_file(root / "vllm" / "__init__.py", "__version__ = '9.9.9'\n")
    return root


def test_roundtrip_and_identity(cache, tmp_path):
    root = _install(tmp_path)
    f = _old_file(tmp_path / "a.py", "x = 1\n")
    ident = ic.identity(root, check=1)
    assert ident["vllm_root"] == str(root.resolve()) and ident["plugin_version"]
    assert ic.load("drift", ident) is None
    assert ic.store("drift", ident, [f, tmp_path / "absent.py"], {"answer": [1, 2]})
    assert ic.load("drift", ident) == {"answer": [1, 2]}
    assert ic.load("drift", ic.identity(root, check=2)) is None       # other identity: other entry
    assert ic.load("relocate", ident) is None                         # kinds are separate
    assert ic.load("drift", ident, files=[str(f)]) is not None
    assert ic.load("drift", ident, files=[str(tmp_path / "other.py")]) is None  # not covered


@pytest.mark.parametrize("change", ["edit", "same_size_edit_new_inode", "remove", "appear", "touch"])
def test_any_change_of_a_recorded_file_makes_the_entry_stale(cache, tmp_path, change):
    root = _install(tmp_path)
    f = _old_file(tmp_path / "a.py", "x = 1\n")
    absent = tmp_path / "b.py"
    ident = ic.identity(root)
    assert ic.store("drift", ident, [f, absent], {"v": 1})
    if change == "edit":
        f.write_text("x = 22\n")
    elif change == "same_size_edit_new_inode":
        f.unlink()
        _old_file(f, "x = 2\n")            # same size, old mtime, but a new inode / ctime
    elif change == "remove":
        f.unlink()
    elif change == "appear":
        absent.write_text("")
    else:
        os.utime(f, None)
    assert ic.load("drift", ident) is None


def test_racy_file_is_not_stored(cache, tmp_path):
    root = _install(tmp_path)
    fresh = tmp_path / "fresh.py"
    fresh.write_text("x = 1\n")   # modified just now: a same-size edit could keep its stamp
    ident = ic.identity(root)
    assert not ic.store("drift", ident, [fresh], {"v": 1})
    assert ic.load("drift", ident) is None


def test_disabled_and_corrupt(cache, tmp_path, monkeypatch):
    root = _install(tmp_path)
    ident = ic.identity(root)
    monkeypatch.setenv("PADPLUGIN_INSTALL_CACHE", "0")
    assert not ic.store("drift", ident, [], {"v": 1}) and ic.load("drift", ident) is None
    monkeypatch.delenv("PADPLUGIN_INSTALL_CACHE")
    assert ic.store("drift", ident, [], {"v": 1})
    ic.entry_path("drift", ident).write_text("{not json")
    assert ic.load("drift", ident) is None


def test_unwritable_cache_is_a_miss_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("PADPLUGIN_CACHE", str(blocker))   # a file where the directory should be
    root = _install(tmp_path)
    ident = ic.identity(root)
    assert ic.store("drift", ident, [], {"v": 1}) is False
    assert ic.load("drift", ident) is None


def test_bounded(cache, tmp_path):
    root = _install(tmp_path)
    for i in range(ic.MAX_ENTRIES + 10):
        assert ic.store("drift", ic.identity(root, n=i), [], {"v": i})
    assert len(list((cache / "install" / "drift").glob("*.json"))) == ic.MAX_ENTRIES
    assert ic.load("drift", ic.identity(root, n=ic.MAX_ENTRIES + 9)) == {"v": ic.MAX_ENTRIES + 9}
    assert ic.prune("drift", max_entries=100, max_bytes=1) == ic.MAX_ENTRIES  # byte bound too
    assert ic.clear() == 0


def test_recording_collects_notes_and_hits(cache, tmp_path):
    root = _install(tmp_path)
    f = _old_file(tmp_path / "a.py", "x = 1\n")
    ident = ic.identity(root)
    ic.note("outside")                     # no recording open: ignored
    with ic.recording() as outer:
        ic.note(f)
        with ic.recording() as inner:
            ic.note(tmp_path / "c.py")
        assert ic.store("drift", ident, outer, {"v": 1})
    assert outer == {str(f), str(tmp_path / "c.py")} and inner == {str(tmp_path / "c.py")}
    with ic.recording() as later:
        assert ic.load("drift", ident) == {"v": 1}
    assert later == outer                  # a hit hands its dependencies to an outer cache


def test_concurrent_stores_and_loads(cache, tmp_path):
    """Many processes storing and loading the same entry at once: every load sees a whole entry
    (or none), every store succeeds, no temp file is left."""
    root = _install(tmp_path)
    ident = ic.identity(root)   # one identity for all (the plugin's code may be edited meanwhile)
    code = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
from vllm_padplugin import install_cache as ic
ident = json.loads({json.dumps(json.dumps(ident))})
data = {{"payload": "x" * 200000}}
bad = 0
for i in range(40):
    ic.store("drift", ident, [], data)
    got = ic.load("drift", ident)
    bad += got is not None and got != data
print(json.dumps({{"bad": bad}}))
"""
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ)) for _ in range(6)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert json.loads(out)["bad"] == 0
    d = cache / "install" / "drift"
    assert [p.name for p in d.iterdir() if p.name.startswith(".tmp-")] == []
    assert ic.load("drift", ident) == {"payload": "x" * 200000}
