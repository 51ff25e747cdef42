"""The load-time drift check answered from the per-install cache, and still checking a changed install.

Real vLLM (the venv's), real subprocesses, real files.  A symlink copy of the installed vLLM
package (``cp -rs``, as ``tests/fault_driver.py`` makes its fault trees; nothing is written
into the venv) is put first on ``sys.path``, so vLLM runs from it and the plugin's check reads
it.  Each load is a fresh interpreter doing what a vLLM process does at start-up: ``import
vllm``, platform resolution, ``load_general_plugins()``.

- load 1 (cold cache) computes and stores; load 2 answers from the cache (no ``compat.*``
  imported), same findings;
- then a surface file of the copy is edited (the factory's signature), and load 3 sees the
  drift: the stale entry is not used;
- many processes started at once on a cold cache all load correctly, with the same findings
  as the check with the cache off, and leave one valid entry, no temp files.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
RF_FILE = "model_executor/layers/fused_moe/router/router_factory.py"

DRIVER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, os.environ["T_VLLM_ROOT"])
    sys.path.insert(0, os.environ["T_PLUGIN_ROOT"])
    import vllm
    assert vllm.__file__.startswith(os.environ["T_VLLM_ROOT"]), vllm.__file__
    from vllm.platforms import current_platform
    current_platform.device_type
    barrier = os.environ.get("T_BARRIER")
    if barrier:  # every process reaches the plugin's load at the same moment
        open(os.path.join(barrier, f"ready-{os.getpid()}"), "w").close()
        deadline = time.time() + 240
        while len(os.listdir(barrier)) < int(os.environ["T_N"]) and time.time() < deadline:
            time.sleep(0.002)
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm_padplugin import shim, state
    print("RESULT=" + json.dumps({
        "cache": shim.LAST.get("cache"),
        "drift": state.STATE.drift,
        "errors": state.STATE.errors,
        "installed": state.STATE.installed,
        "compat_imported": sorted(m for m in sys.modules if m.split(".")[:2] == ["vllm_padplugin", "compat"]),
    }))
""")


def _copy_install(dest: Path) -> Path:
    """Symlink copy of the installed vllm package under ``dest``; returns the root to put on sys.path."""
    import importlib.util

    src = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    dest.mkdir(parents=True)
    subprocess.run(["cp", "-rs", str(src), str(dest / "vllm")], check=True)
    _materialize(dest / "vllm" / "__init__.py")  # vllm.__file__ resolves into the copy
    return dest


def _materialize(path: Path) -> None:
    """Replace a symlink by a real copy of its file, with the original's times (like ``cp -p``)."""
    real = path.resolve()
    path.unlink()
    shutil.copy2(real, path)


def _edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / "vllm" / rel
    text = path.read_text()
    assert old in text, f"edit does not apply to {rel}"
    path.unlink()  # a changed file: new inode, new mtime (a real upgrade rewrites it too)
    path.write_text(text.replace(old, new, 1))


def _load(root: Path, cache: Path, **extra: str) -> dict:
    env = dict(os.environ, T_VLLM_ROOT=str(root), T_PLUGIN_ROOT=str(HERE.parent), PADPLUGIN_CACHE=str(cache),
               VLLM_LOGGING_LEVEL="WARNING", **extra)
    for k in ("VLLM_PLUGINS", "PADPLUGIN_STRICT", "PADPLUGIN_FORCE_MODE", "PADPLUGIN_INSTALL_CACHE"):
        if k not in extra:
            env.pop(k, None)
    p = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, env=env, timeout=300)
    return _result(p)


def _result(p) -> dict:
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT=")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-3000:]
    res = json.loads(line[0][len("RESULT="):])
    assert res["installed"] and res["errors"] == [], res
    return res


def _kinds(res: dict) -> set:
    return {(f["kind"], f["key"], f.get("item", ""), f["severity"]) for f in res["drift"]}


def _entries(cache: Path) -> list[Path]:
    d = cache / "install" / "drift"
    return sorted(d.iterdir()) if d.is_dir() else []


def _edits(root: Path) -> list[tuple[str, str, tuple]]:
    """(old, new, expected finding) for edits of the factory's signature that apply to this vLLM."""
    text = (root / "vllm" / RF_FILE).read_text()
    out = [("    use_grouped_topk: bool = False,", "    grouped_topk: bool = False,",
            ("param-removed", "router_factory", "use_grouped_topk", "breaking"))]
    if "    skip_padding: bool = False," in text:   # 0.31+: the brief's example edit
        out.append(("    skip_padding: bool = False,\n", "",
                    ("param-removed", "router_factory", "skip_padding", "info")))
    return out


@pytest.mark.slow
def test_cached_load_then_changed_install_is_checked_again(vllm, tmp_path):
    root = _copy_install(tmp_path / "site")
    cache = tmp_path / "cache"
    reference = _load(root, cache, PADPLUGIN_INSTALL_CACHE="0")   # the check with no cache at all
    assert reference["cache"] == "miss" and _entries(cache) == []

    first = _load(root, cache)
    assert first["cache"] == "stored" and len(_entries(cache)) == 1
    second = _load(root, cache)
    assert second["cache"] == "hit", second
    assert second["compat_imported"] == [], "a cache hit must not import the compat checker"
    assert second["drift"] == first["drift"] == reference["drift"]

    for old, new, expected in _edits(root):
        before = _kinds(_load(root, cache))
        assert expected not in before
        _edit(root, RF_FILE, old, new)
        after = _load(root, cache)
        # the entry for the old file must not answer for the edited one: checked afresh, then stored
        # ("miss" = not stored because the edit is younger than install_cache.RACY_S)
        assert after["cache"] in ("stored", "miss"), after["cache"]
        assert expected in _kinds(after), (expected, after["drift"])
        assert after["compat_imported"], "the changed install was checked by the real checker"
        if after["cache"] == "miss":
            time.sleep(2.1)
            stored = _load(root, cache)
            assert stored["cache"] == "stored" and _kinds(stored) == _kinds(after)
        again = _load(root, cache)
        assert again["cache"] == "hit" and _kinds(again) == _kinds(after)


@pytest.mark.slow
def test_processes_starting_at_once_on_a_cold_cache(vllm, tmp_path):
    root = Path(__import__("importlib.util").util.find_spec("vllm").submodule_search_locations[0]).parent
    cache = tmp_path / "cache"
    reference = _load(root, tmp_path / "unused", PADPLUGIN_INSTALL_CACHE="0")
    n = 6
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = dict(os.environ, T_VLLM_ROOT=str(root), T_PLUGIN_ROOT=str(HERE.parent), PADPLUGIN_CACHE=str(cache),
               VLLM_LOGGING_LEVEL="WARNING", T_BARRIER=str(barrier), T_N=str(n))
    for k in ("VLLM_PLUGINS", "PADPLUGIN_STRICT", "PADPLUGIN_FORCE_MODE", "PADPLUGIN_INSTALL_CACHE"):
        env.pop(k, None)
    procs = [subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(n)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=400)
        results.append(_result(subprocess.CompletedProcess(p.args, p.returncode, out, err)))
    assert all(r["drift"] == reference["drift"] for r in results)
    assert {r["cache"] for r in results} <= {"stored", "hit"}, [r["cache"] for r in results]
    d = cache / "install" / "drift"
    assert [p.name for p in d.iterdir() if p.name.startswith(".tmp-")] == []
    assert len(_entries(cache)) == 1
    assert _load(root, cache)["cache"] == "hit"
