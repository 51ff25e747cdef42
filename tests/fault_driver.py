"""Fault-injection driver: apply ONE fault to the real vLLM in this process, load the plugin
through vLLM's real loader, then show what a user would get.  Prints ``RESULT=<json>``.

    python tests/fault_driver.py FAULT [--masking] [--engine]

FAULT: a source fault in TREES (sig_incompatible, factory_moved, factory_removed,
no_is_padding), a live one in BEFORE/AFTER (env_garbage, foreign_before, foreign_after,
dev_version, loaded_twice), or ``none``.

Order (``VLLM_TARGET_DEVICE=cpu``, so vLLM never calls platform hooks and nothing of the
plugin runs before the fault is in place): import vLLM's MoE layer (real modules) ->
apply the fault (monkeypatching upstream objects IS the fault) -> plugins:
``vllm.plugins.load_general_plugins()`` (router mode), or ``LLM(...)`` with V1
multiprocessing off (engine mode: vLLM loads the plugins itself, builds the tiny
DeepSeek-V3 in this process and generates) -> after-load faults (another plugin
assigning its factory after us) -> checks.

Router mode builds routers through the real binding site
(``fused_moe.layer.create_fused_moe_router``) and compares their routes with routers
from upstream's own factory object (the layer's binding, taken before the plugin loads).  Masking faults
(``--masking``) need a GroupedTopKRouter: the factory module's ``current_platform``
is then the FAKE ``NotCpuPlatform`` proxy of test_router_masking (this machine is
CPU-only), with the mode forced to backport and DeepEP v2 set through vLLM's config.
"""
from __future__ import annotations

import json
import os
import sys

LAYER = "vllm.model_executor.layers.fused_moe.layer"
RF = "vllm.model_executor.layers.fused_moe.router.router_factory"
MOVED_TO = "vllm.model_executor.layers.fused_moe.router.router_factory_v2"
FC = "vllm.forward_context"


# --------------------------------------------------------------------------- the faults
def fake_gaudi(target):
    """FAKE of vllm-gaudi's factory replacement (not installable here): forwards to
    ``target`` without ``skip_padding`` and without functools.wraps; counts calls."""

    def hpu_create_fused_moe_router(*args, **kwargs):
        kwargs.pop("skip_padding", None)
        hpu_create_fused_moe_router.calls += 1
        return target(*args, **kwargs)

    hpu_create_fused_moe_router.calls = 0
    hpu_create_fused_moe_router.__module__ = "vllm_gaudi.fake_ops"
    hpu_create_fused_moe_router.__qualname__ = "hpu_create_fused_moe_router"
    return hpu_create_fused_moe_router


# Source faults: upstream changed its FILES.  A symlink copy of the installed vLLM package
# (``cp -rs``; nothing is written into the venv) with the changed files as real files is
# put first on sys.path, so vLLM runs from it and the plugin's checks read it, as they
# would read a newer vLLM.
def _fault_tree(edit) -> str:
    import importlib.util
    import shutil
    import subprocess
    import tempfile

    src = importlib.util.find_spec("vllm").submodule_search_locations[0]
    root = tempfile.mkdtemp(prefix="padplugin-fault-vllm-", dir=os.environ.get("FAULT_TREE_DIR"))
    subprocess.run(["cp", "-rs", src, os.path.join(root, "vllm")], check=True)
    pkg = os.path.join(root, "vllm")
    _materialize(pkg, "__init__.py")  # a real file: vllm.__file__ resolves into the copy
    edit(pkg)
    return root


def _materialize(pkg: str, rel: str) -> str:
    path = os.path.join(pkg, rel)
    text = open(path).read()
    os.remove(path)
    with open(path, "w") as fh:
        fh.write(text)
    return path


def _edit(pkg: str, rel: str, fn) -> None:
    path = _materialize(pkg, rel)
    text = open(path).read()
    new = fn(text)
    assert new != text, f"fault edit did not apply to {rel}"
    with open(path, "w") as fh:
        fh.write(new)


RF_FILE = "model_executor/layers/fused_moe/router/router_factory.py"
LAYER_FILE = "model_executor/layers/fused_moe/layer.py"


def sig_incompatible_tree(pkg: str) -> None:
    """Upstream renamed the factory's ``use_grouped_topk`` parameter to ``grouped_topk``
    (and its own caller in layer.py with it): any caller passing the old name breaks."""
    import re

    # the parameter and every use of its value, not keywords passed to other routers
    _edit(pkg, RF_FILE, lambda t: re.sub(r"\buse_grouped_topk\b(?!\s*=[^=])", "grouped_topk", t))

    def layer(t: str) -> str:
        i = re.search(r"=\s*create_fused_moe_router\(", t).end()  # the call, not the import
        j = t.index("use_grouped_topk=", i)
        return t[:j] + "grouped_topk=" + t[j + len("use_grouped_topk="):]

    _edit(pkg, LAYER_FILE, layer)


def factory_moved_tree(pkg: str) -> None:
    """Upstream moved the factory's module: ``router/router_factory.py`` is now
    ``router/router_factory_v2.py`` and layer.py imports it from there."""
    old = os.path.join(pkg, RF_FILE)
    new = old.replace("router_factory.py", "router_factory_v2.py")
    text = open(old).read()
    os.remove(old)
    with open(new, "w") as fh:
        fh.write(text)
    _edit(pkg, LAYER_FILE, lambda t: t.replace("router.router_factory import", "router.router_factory_v2 import"))


def no_is_padding_tree(pkg: str) -> None:
    """``ForwardContext`` has no ``is_padding`` field and ``create_forward_context`` /
    ``set_forward_context`` no longer take it (a vLLM before that API existed)."""
    import re

    _edit(pkg, "forward_context.py", lambda t: re.sub(
        r"\n[ \t]*is_padding(: torch\.Tensor \| None = None|=is_padding),?(?=\n)", "", t))


def factory_removed_tree(pkg: str) -> None:
    """Upstream removed ``create_fused_moe_router``: routers come from a differently named
    function (``build_router``) that layer.py imports under the old local name."""
    _edit(pkg, RF_FILE, lambda t: t.replace("def create_fused_moe_router(", "def build_router("))
    _edit(pkg, LAYER_FILE, lambda t: t.replace(
        "router.router_factory import (\n    create_fused_moe_router,",
        "router.router_factory import (\n    build_router as create_fused_moe_router,"))


TREES = {"sig_incompatible": sig_incompatible_tree, "factory_moved": factory_moved_tree,
         "factory_removed": factory_removed_tree,
         "no_is_padding": no_is_padding_tree}


def env_garbage(m):
    os.environ["VLLM_MOE_SKIP_PADDING"] = "maybe"


def foreign_before(m):
    m["gaudi"] = fake_gaudi(m["upstream"])
    m["layer"].create_fused_moe_router = m["gaudi"]


def foreign_after(m):
    m["gaudi"] = fake_gaudi(m["upstream"])
    m["layer"].create_fused_moe_router = m["gaudi"]  # through our module guard, if any


def dev_version(m):
    import vllm

    vllm.__version__ = os.environ.get("FAULT_VLLM_VERSION", "0.35.0.dev12+gabc1234")


def loaded_twice(m):
    pass


def none(m):
    pass


BEFORE = {f.__name__: f for f in (env_garbage, foreign_before, dev_version, loaded_twice, none)}
AFTER = {"foreign_after": foreign_after}


# --------------------------------------------------------------------------- checks
def _routes(factory, masking: bool, is_padding=None, with_context=True):
    """Routes of a DeepSeek-V3-style grouped router built by ``factory`` (test_router_masking's
    inputs and forward context); DeepEP v2 config only for masking faults."""
    import inspect

    import torch
    from test_router_masking import E, G, K, TOPG, deepep_v2_config, inputs
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context

    # after the sig_incompatible fault upstream's callers say grouped_topk=
    params = inspect.signature(factory).parameters
    grouped = "use_grouped_topk" if "use_grouped_topk" in params else "grouped_topk"
    with set_current_vllm_config(deepep_v2_config() if masking else VllmConfig()):
        router = factory(top_k=K, global_num_experts=E, num_expert_group=G, topk_group=TOPG,
                         scoring_func="sigmoid", renormalize=True,
                         e_score_correction_bias=torch.linspace(-0.1, 0.1, E), **{grouped: True})
    h, logits = inputs()
    if not with_context:  # no forward context at call time (profiling, dummy runs)
        w, ids = router.select_experts(h, logits)[:2]
    else:
        # after the no_is_padding fault set_forward_context has no is_padding parameter
        kw = {"is_padding": is_padding} if "is_padding" in inspect.signature(set_forward_context).parameters else {}
        with set_forward_context(None, VllmConfig(), num_tokens=h.shape[0], **kw):
            w, ids = router.select_experts(h, logits)[:2]
    return type(router).__name__, w, ids


def router_checks(m, masking: bool) -> dict:
    import torch
    from test_router_masking import PAD, mask

    from vllm_padplugin.router_override import is_ours

    out = {"layer_factory_is_ours": is_ours(m["layer"].create_fused_moe_router)}
    cls, w, ids = _routes(m["layer"].create_fused_moe_router, masking, mask())
    _, rw, rids = _routes(m["upstream"], False, None, with_context=False)
    pad = torch.tensor(PAD)
    out["router_class"] = cls
    out["routes_equal_upstream"] = bool(torch.equal(w, rw) and torch.equal(ids, rids))
    out["padded_rows_masked"] = bool(torch.all(ids[pad] == -1) and torch.all(w[pad] == 0))
    out["real_rows_equal_upstream"] = bool(torch.equal(w[~pad], rw[~pad]) and torch.equal(ids[~pad], rids[~pad]))
    # No forward context at call time (profiling/dummy runs): must route like upstream.
    _, nw, nids = _routes(m["layer"].create_fused_moe_router, masking, None, with_context=False)
    out["no_context_routes_equal_upstream"] = bool(torch.equal(nw, rw) and torch.equal(nids, rids))
    return out


def engine_run() -> dict:
    from vllm import LLM, SamplingParams

    from vllm_padplugin.tiny_model import build_tiny_model, prompt_token_ids

    llm = LLM(model=str(build_tiny_model()), skip_tokenizer_init=True, enforce_eager=True, seed=0,
              max_model_len=256, max_num_seqs=4, kv_cache_memory_bytes=64 << 20)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": prompt_token_ids(8)}], params, use_tqdm=False)
    return {"generated_token_ids": list(outs[0].outputs[0].token_ids)}


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    fault = sys.argv[1]
    engine = "--engine" in sys.argv
    masking = "--masking" in sys.argv
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if fault in TREES:
        root = _fault_tree(TREES[fault])
        sys.path.insert(0, root)
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    if engine:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import importlib

    m = {"layer": importlib.import_module(LAYER), "fc": importlib.import_module(FC)}
    m["rf"] = importlib.import_module(MOVED_TO if fault == "factory_moved" else RF)
    m["upstream"] = m["layer"].create_fused_moe_router  # upstream's, whatever its home
    if masking:
        from test_router_masking import NotCpuPlatform

        m["rf"].current_platform = NotCpuPlatform(m["rf"].current_platform)
    BEFORE.get(fault, none)(m)
    result: dict = {"fault": fault}
    try:
        if engine:
            if fault in AFTER:  # vLLM loads plugins in LLM(); "after us" = after that load
                from vllm.plugins import load_general_plugins

                load_general_plugins()
                AFTER[fault](m)
            result.update(engine_run())
        else:
            from vllm.plugins import load_general_plugins

            load_general_plugins()
            if fault == "loaded_twice":
                import vllm.plugins
                import vllm_padplugin

                vllm.plugins.plugins_loaded = False
                load_general_plugins()
                vllm_padplugin.register_platform()
                vllm_padplugin.register()
            AFTER.get(fault, none)(m)
            result.update(router_checks(m, masking))
    except Exception as exc:  # strict mode: what the user gets
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"FAULT_DRIVER_ERROR {result['error']}", file=sys.stderr)
    if "gaudi" in m:
        result["foreign_calls"] = m["gaudi"].calls
    from vllm_padplugin.report import build_report

    result["report"] = build_report()
    print("RESULT=" + json.dumps(result, default=str), flush=True)
    return 3 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
