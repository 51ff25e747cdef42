"""The plugin's modules import each other in layers, never in a loop.

Parses every module of the package (``ast``; nothing imported) and builds the graph of
imports between its modules, counting imports inside functions too: a lazy import is
still a dependency, and a loop through one is how ``plugin`` <-> ``binding_sites`` and
``report`` <-> ``router_override`` used to call each other.  The package itself
(``vllm_padplugin/__init__.py``) is not a node: Python imports it before any submodule
anyway, and it holds only the entry points.

The glue modules (the load path: loader, state, report, binding sites, the factory
wrapper, the drift shim, the patches, the CLI) must form no cycle; the load path must
read top to bottom in the order of ``LAYERS``.
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "vllm_padplugin"
NAME = "vllm_padplugin"

# Bottom to top: a module may import modules of its own or a lower layer only.
LAYERS = [
    {"state", "marks", "surface", "install_cache", "import_hooks", "live_answers", "compat_utils", "masking",
     "padding_mask", "kernels"},
    {"compat", "relocate", "runtime_view", "binding_sites", "report"},   # static checker; report
    {"shim", "platforms"},                                              # drift check at load; mode
    {"routing", "router_override", "patches"},                          # what the plugin installs
    {"plugin"},                                                         # the loader (vLLM's hooks)
    {"cli", "demo", "bench", "tiny_model"},
]


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Package modules ``path`` imports (anywhere in the file), as dotted names."""
    me = module_name(path)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == NAME)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            if src.split(".")[0] != NAME:
                continue
            for a in node.names:   # "from pkg import submodule" names the submodule
                sub = f"{src}.{a.name}"
                out.add(sub if _exists(sub) else src)
    return {m for m in out if m != NAME and m != me}


def _exists(mod: str) -> bool:
    rel = Path(*mod.split(".")[1:])
    return (PKG / rel).with_suffix(".py").is_file() or (PKG / rel / "__init__.py").is_file()


def graph() -> dict[str, set[str]]:
    g = {}
    for path in PKG.rglob("*.py"):
        m = module_name(path)
        if m != NAME:
            g[m] = {i for i in imports_of(path) if _exists(i)}
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def top(mod: str) -> str:
    """The glue unit a module belongs to: ``vllm_padplugin.patches.base`` -> ``patches``."""
    return mod.split(".")[1]


def test_no_import_cycle_in_the_package():
    assert cycles(graph()) == []


def test_glue_modules_import_downwards_only():
    layer_of = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    bad = []
    for mod, deps in graph().items():
        me = top(mod)
        if me not in layer_of:
            continue
        for dep in deps:
            d = top(dep)
            if d in layer_of and d != me and layer_of[d] > layer_of[me]:
                bad.append(f"{mod} -> {dep}")
    assert bad == [], "imports going up the layers: " + ", ".join(sorted(bad))


def test_detector_finds_a_loop():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]


def test_failure_recording_has_one_home():
    """``fail``/``patch_failed``/``safe_hook`` are defined in state only; nobody imports them from plugin."""
    defs, users = [], []
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in ("fail", "_fail", "patch_failed",
                                                                   "_patch_failed", "safe_hook"):
                defs.append(f"{module_name(path)}.{node.name}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("plugin") and any(
                    a.name in ("_fail", "_patch_failed") for a in node.names):
                users.append(module_name(path))
    assert sorted(defs) == [f"{NAME}.state.fail", f"{NAME}.state.patch_failed", f"{NAME}.state.safe_hook"]
    assert users == []
