"""Static compat across vLLM main's package reorganisation (issue 12).

A reorganised tree is built from the official 0.32.0 sources by ``reorg_tree.build`` (the
moves main's snapshots show; every import rewritten), with and without a forwarding shim
at the old paths.  ``vllm-padplugin compat`` must then report zero breaking drift and ONE
info ``symbol-moved`` finding per move naming the new home; a symbol that is really gone
(renamed everywhere) is still red; two equally good candidates are an error naming both;
and the static check of such a tree stays within 2 s.  The last test runs compat against
a tree written from the FACTS of real vLLM main (tests/fixtures/reorg/main_facts.json).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

import reorg_tree
from compat_helpers import FX
from vllm_padplugin.cli.compat import run_compat
from vllm_padplugin.relocate import moved_like

FACTS = Path(__file__).resolve().parent / "fixtures" / "reorg" / "main_facts.json"
# registry module -> where the reorganised tree defines what the plugin uses
EXPECT = {
    "vllm.forward_context": "vllm.runtime.execution.forward_context",
    "vllm.envs": "vllm.foundation.system.envs",
    "vllm.platforms": "vllm.backends.platform",
    "vllm.config": "vllm.foundation.config.vllm",   # get_current_vllm_config is defined in config/vllm.py
}


def _compat(tree) -> tuple[int, dict]:
    out, code = run_compat(vllm_src=tree, fmt="json")
    return code, json.loads(out)


@pytest.fixture(scope="module")
def trees(releases_dir, tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("reorg")
    out = {"none": reorg_tree.build(releases_dir / "0.32.0", base / "none")}
    for shim in ("alias", "getattr", "reexport"):
        out[shim] = reorg_tree.build(releases_dir / "0.32.0", base / shim,
                                     reorg_tree.with_shims(reorg_tree.MAIN_MOVES, shim))
    return out


def moved(doc) -> dict:
    return {f["moved_from"]: f for f in doc["findings"] if f["kind"] == "symbol-moved"}


def test_generator_really_moves_and_rewrites(trees):
    t = trees["none"]
    assert not (t / "vllm" / "forward_context.py").exists() and not (t / "vllm" / "platforms").exists()
    assert (t / "vllm/runtime/execution/forward_context.py").is_file()
    assert (t / "vllm/backends/distributed/eplb/eplb_state.py").is_file()
    text = (t / "vllm/model_executor/layers/fused_moe/router/router_factory.py").read_text()
    assert "vllm.backends.distributed.eplb.eplb_state import" in text and "import vllm.envs" not in text
    leftovers = [p for p in (t / "vllm").rglob("*.py")
                 if any(f"{w} import" in p.read_text(errors="replace") or f"import {w}" in p.read_text(errors="replace")
                        for w in ("vllm.forward_context", "vllm.envs", "vllm.platforms", "vllm.config"))]
    assert leftovers == []


@pytest.mark.parametrize("shim", ["none", "alias", "getattr", "reexport"])
def test_moves_are_info_one_per_move(trees, shim):
    code, doc = _compat(trees[shim])
    assert code == 0 and doc["compatible"] and doc["breaking"] == 0, doc["findings"]
    assert doc["mode"] == "native"
    got = moved(doc)
    assert set(got) == set(EXPECT), doc["findings"]
    assert len([f for f in doc["findings"] if f["kind"] == "symbol-moved"]) == len(EXPECT)
    for old, new in EXPECT.items():
        f = got[old]
        assert f["severity"] == "info" and f["status"] == "moved" and f["moved_to"] == [new], f
        assert f["detail"].startswith("found ") and f"(moved from {old};" in f["detail"]
        assert f["via"] == ("search" if shim == "none" else "shim") or old == "vllm.config", f
    fc = got["vllm.forward_context"]
    assert set(fc["keys"]) == {"forward_context_is_padding", "get_forward_context", "is_forward_context_available",
                               "create_forward_context", "set_forward_context"}
    # nothing else: the moved symbols were checked at their new homes and are fine
    assert {f["kind"] for f in doc["findings"]} == {"symbol-moved"}


def test_really_removed_symbol_is_still_red(trees, tmp_path):
    t = tmp_path / "removed"
    shutil.copytree(trees["none"], t, symlinks=True)
    reorg_tree.remove_symbol(t, "", "is_forward_context_available", "forward_context_is_set")
    code, doc = _compat(t)
    assert code == 1 and not doc["compatible"]
    red = [f for f in doc["findings"] if f["severity"] == "breaking"]
    assert [(f["kind"], f["key"]) for f in red] == [("symbol-removed", "is_forward_context_available")], red
    assert red[0]["symbol"] == "vllm.runtime.execution.forward_context.is_forward_context_available"
    # the rest of the module still counts as moved (info)
    assert "vllm.forward_context" in moved(doc)


def test_two_candidates_are_an_error_naming_both(trees, tmp_path):
    t = tmp_path / "ambiguous"
    shutil.copytree(trees["none"], t, symlinks=True)
    src = t / "vllm/runtime/execution/forward_context.py"
    dup = t / "vllm/runtime/legacy/forward_context.py"
    dup.parent.mkdir(parents=True)
    (dup.parent / "__init__.py").write_text("")
    dup.write_text(src.read_text())
    code, doc = _compat(t)
    assert code == 1
    amb = [f for f in doc["findings"] if f["kind"] == "symbol-ambiguous"]
    assert amb and all(f["severity"] == "breaking" for f in amb)
    for f in amb:
        assert f["candidates"] == ["vllm.runtime.execution.forward_context", "vllm.runtime.legacy.forward_context"]
        assert "vllm.runtime.execution.forward_context" in f["detail"] and "vllm.runtime.legacy.forward_context" in f["detail"]
    assert "vllm.forward_context" not in moved(doc)    # never a guess


def test_static_compat_of_reorganised_tree_within_2s(trees):
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        code, _ = _compat(trees["none"])
        times.append(time.perf_counter() - t0)
        assert code == 0
    print(f"static compat of the reorganised 0.32.0 tree: best {min(times):.2f} s, runs {times}")
    assert min(times) <= 2.0


# -- real vLLM main, from the facts read off its snapshots ---------------------------------

def _py_module(spec: dict) -> str:
    """A stub module from the facts: each defined name with the parameters / fields read off main."""
    lines = ["from contextlib import contextmanager", "from dataclasses import dataclass", ""]
    for name, d in spec["defines"].items():
        if d["kind"] == "class":
            lines += ["@dataclass", f"class {name}:"] + [f"    {f}: object = None" for f in d["fields"]] + [""]
        else:
            params = ", ".join(f"{p}=None" for p in d["params"])
            lines += (["@contextmanager"] if d.get("contextmanager") else []) + [f"def {name}({params}):",
                                                                                 "    return None", ""]
    return "\n".join(lines)


def _make_packages(t: Path, dst: Path) -> None:
    """The folders leading to ``dst`` under ``t/vllm``, each a package (an empty ``__init__.py``)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    for d in dst.relative_to(t / "vllm").parents:
        init = t / "vllm" / d / "__init__.py"
        if not init.exists():
            init.write_text("")


def test_compat_against_facts_of_real_main(tmp_path):
    """The fake vLLM of the compat fixtures, reorganised as main's snapshots show: the
    forward context module is written from the facts at its new path (nothing left at the
    old one), envs/platforms/config moved as the listed paths say (their content stays the
    fixture's: see not_verified in the facts file), and main's second MoE paths written from
    the facts (their own create_fused_moe_router, a layer importing it): nothing reported for
    them."""
    facts = json.loads(FACTS.read_text())
    t = tmp_path / "main"
    shutil.copytree(FX / "vllm_base", t)
    fc = facts["modules"]["vllm.runtime.execution.forward_context"]
    assert fc["moved_from"] == "vllm.forward_context"
    (t / "vllm/forward_context.py").unlink()
    new = t / "vllm/runtime/execution/forward_context.py"
    new.parent.mkdir(parents=True)
    for d in (t / "vllm/runtime", new.parent):
        (d / "__init__.py").write_text("")
    new.write_text(_py_module(fc))
    for old, rel in (("vllm/envs.py", "vllm/foundation/system/envs.py"),
                     ("vllm/platforms", "vllm/backends/platform"), ("vllm/config", "vllm/foundation/config")):
        assert rel + ("/__init__.py" if not rel.endswith(".py") else "") in facts["paths"]
        dst = t / rel
        _make_packages(t, dst)
        shutil.move(str(t / old), str(dst))
    (t / "vllm/foundation/config/__init__.py").write_text(
        (t / "vllm/foundation/config/__init__.py").read_text().replace("vllm.config.", "vllm.foundation.config."))
    for name, spec in facts["second_moe_paths"]["modules"].items():   # their own same-named factories
        dst = t / (name.replace(".", "/") + ".py")
        _make_packages(t, dst)
        dst.write_text(_py_module(spec) if "defines" in spec else
                       "".join("from {} import {}\n".format(*i.split(":")) for i in spec["imports"]))
    code, doc = _compat(t)
    assert code == 0 and doc["breaking"] == 0, doc["findings"]
    got = moved(doc)
    assert got["vllm.forward_context"]["moved_to"] == ["vllm.runtime.execution.forward_context"]
    assert got["vllm.envs"]["moved_to"] == ["vllm.foundation.system.envs"]
    assert got["vllm.platforms"]["moved_to"] == ["vllm.backends.platform"]
    assert got["vllm.config"]["moved_to"] == ["vllm.foundation.config.vllm"]
    # the router factory and the layer did not move on main, the second paths are not ours: no finding
    assert not any("fused_moe" in f["symbol"] for f in doc["findings"])


def test_factory_and_layer_module_moved_too(releases_dir, tmp_path):
    """Goal 2: the MoE layer package moves as well: the factory and its binding site (layer.py)
    are found at the new home; the known site is relocated (no "new binding site" finding)."""
    new = "vllm.runtime.modeling.layers.fused_moe"
    moves = reorg_tree.MAIN_MOVES + (reorg_tree.Move("vllm.model_executor.layers.fused_moe", new),)
    code, doc = _compat(reorg_tree.build(releases_dir / "0.32.0", tmp_path / "fm", moves))
    assert code == 0 and doc["breaking"] == 0, doc["findings"]
    got = moved(doc)
    old = "vllm.model_executor.layers.fused_moe"
    assert got[f"{old}.router.router_factory"]["moved_to"] == [f"{new}.router.router_factory"]
    assert got[f"{old}.layer"]["moved_to"] == [f"{new}.layer"]
    assert got[f"{old}.router.grouped_topk_router"]["moved_to"] == [f"{new}.router.grouped_topk_router"]
    assert {f["kind"] for f in doc["findings"]} == {"symbol-moved"} and doc["mode"] == "native"


SECOND = "vllm.model_executor.hw_agnostic.layers.fused_moe"


def test_moved_factory_beside_a_second_moe_path(releases_dir, tmp_path):
    """vLLM main also has a second MoE path (``hw_agnostic``: its own create_fused_moe_router
    and fused_moe/layer.py).  Were the MoE package to move, the search finds two of each; the
    one where the package's other modules (GroupedTopKRouter's, BaseRouter's, the config's)
    moved is taken, and the report names both candidates.  No binding-site finding for the
    second path's layer: it imports its own factory."""
    new = "vllm.runtime.modeling.layers.fused_moe"
    moves = reorg_tree.MAIN_MOVES + (reorg_tree.Move("vllm.model_executor.layers.fused_moe", new),)
    tree = reorg_tree.build(releases_dir / "0.32.0", tmp_path / "fm2", moves)
    reorg_tree.add_second_moe_path(tree)
    code, doc = _compat(tree)
    assert code == 0 and doc["breaking"] == 0, doc["findings"]
    got = moved(doc)
    old = "vllm.model_executor.layers.fused_moe"
    for mod in ("router.router_factory", "layer"):
        f = got[f"{old}.{mod}"]
        assert f["moved_to"] == [f"{new}.{mod}"] and f["via"] == "siblings", f
        assert f"{SECOND}.{mod}" in f["detail"] and f"{new}.{mod}" in f["detail"]
    assert {f["kind"] for f in doc["findings"]} == {"symbol-moved"}


def test_factory_moved_alone_beside_a_second_moe_path_is_ambiguous(releases_dir, tmp_path):
    """Only the factory's module moves (no package-mate moved with it): two candidates and no
    sibling to tell them apart: breaking, naming both, never a guess."""
    rf = "vllm.model_executor.layers.fused_moe.router.router_factory"
    tree = reorg_tree.build(releases_dir / "0.32.0", tmp_path / "rf",
                            reorg_tree.MAIN_MOVES + (reorg_tree.Move(rf, "vllm.runtime.routing.router_factory"),))
    reorg_tree.add_second_moe_path(tree)
    code, doc = _compat(tree)
    amb = [f for f in doc["findings"] if f["kind"] == "symbol-ambiguous"]
    assert code == 1 and amb, doc["findings"]
    assert all(f["candidates"] == [f"{SECOND}.router.router_factory", "vllm.runtime.routing.router_factory"]
               for f in amb if "router_factory" in f["symbol"])


@pytest.mark.parametrize("old,new,module,want", [
    # the MoE package moved: a module of it moves the same way
    ("vllm.model_executor.layers.fused_moe.config", "vllm.runtime.modeling.layers.fused_moe.config",
     "vllm.model_executor.layers.fused_moe.layer", "vllm.runtime.modeling.layers.fused_moe.layer"),
    # a file moved alone: its head is the package; a sibling file maps into the new package
    ("vllm.forward_context", "vllm.runtime.execution.forward_context", "vllm.envs",
     "vllm.runtime.execution.envs"),
    # not under the moved head: no answer
    ("vllm.a.b.x", "vllm.c.x", "vllm.z.y", ""),
    # the moved module itself is not "like" anything: the head alone names no module
    ("vllm.a.x", "vllm.b.x", "vllm.a", ""),
])
def test_moved_like(old, new, module, want):
    assert moved_like(old, new, module) == want
