"""Shared fixtures.

- ``releases_dir``: official vLLM 0.28-0.34 sources (``PADPLUGIN_RELEASES_DIR``, default
  ``/root/.cache/vllm_padplugin/releases``), skipped with a reason when absent;
- ``VLLM_CACHE_ROOT`` points into a temp dir for the whole session (vLLM writes there);
- ``vllm``: the installed vLLM (skip when absent; tests using it are marked ``vllm``);
- ``plugin_sandbox``: lets a test install the plugin in THIS process and restores every
  vllm module attribute / module class it touched plus the plugin state afterwards.
"""
from __future__ import annotations

import os
import sys
import tempfile
import types
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="padplugin-vllm-cache-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_RELEASES = "/root/.cache/vllm_padplugin/releases"
RELEASES = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")


@pytest.fixture(scope="session")
def releases_dir() -> Path:
    d = Path(os.environ.get("PADPLUGIN_RELEASES_DIR", DEFAULT_RELEASES))
    if not d.is_dir():
        pytest.skip(f"vLLM release sources absent at {d} (run ci/vllm_releases.py or set PADPLUGIN_RELEASES_DIR)")
    return d


@pytest.fixture(scope="session")
def vllm():
    return pytest.importorskip("vllm")


def vllm_version_tuple() -> tuple[int, int]:
    import vllm as v

    parts = str(v.__version__).split(".")
    return int(parts[0]), int(parts[1])


def _snapshot_vllm_modules() -> dict:
    snap = {}
    for name, mod in list(sys.modules.items()):
        if (name == "vllm" or name.startswith("vllm.")) and isinstance(mod, types.ModuleType):
            snap[name] = (mod, mod.__class__, dict(vars(mod)))
    return snap


def _restore(snap: dict) -> None:
    for name, (mod, cls, d) in snap.items():
        if mod.__class__ is not cls:
            mod.__class__ = cls
        cur = vars(mod)
        for k, v in d.items():
            if cur.get(k, object()) is not v:
                types.ModuleType.__setattr__(mod, k, v)
        for k in [k for k in cur if k not in d and k.startswith("__padplugin")]:
            del cur[k]


@pytest.fixture
def plugin_sandbox(vllm, monkeypatch):
    """Fresh plugin state + restore of every vllm module touched during the test.

    Imports the router factory first (so the snapshot holds what upstream bound);
    if the plugin was already installed in this pytest process (vLLM called our
    platform hook), the snapshot is taken after removing our wrappers, so each test
    starts from upstream's objects.
    """
    import importlib

    from vllm_padplugin import binding_sites, state
    from vllm_padplugin.router_override import is_ours

    importlib.import_module("vllm.model_executor.layers.fused_moe.layer")
    # undo a previous installation in this process (platform hook path)
    for mod, attr in binding_sites.holders(is_ours):
        f = getattr(mod, attr)
        inner = f.__padplugin_inner__
        while is_ours(inner):
            inner = inner.__padplugin_inner__
        types.ModuleType.__setattr__(mod, attr, inner)
    for name, mod in list(sys.modules.items()):
        if name.startswith("vllm") and isinstance(mod, binding_sites._GuardedModule):
            mod.__class__ = types.ModuleType
    binding_sites.set_assign_hook(None)
    state.WARNED.clear()
    snap = _snapshot_vllm_modules()
    saved = state.STATE
    state.STATE = state.PluginState()
    monkeypatch.setattr(state, "STATE", state.STATE)
    try:
        yield state.STATE
    finally:
        binding_sites.set_assign_hook(None)
        _restore(snap)
        state.STATE = saved
