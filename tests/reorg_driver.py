"""Run the REAL installed vLLM after a package reorganisation, with or without the plugin.

    python tests/reorg_driver.py engine|router [--shim alias|getattr|reexport] [--remove NAME] [--fused-moe]

The installed vLLM package is copied as a symlink farm and reorganised by
``reorg_tree.build`` (the moves vLLM main's snapshots show: forward_context, envs,
platforms, config, eplb_state; imports rewritten; nothing written into the venv), and put
first on ``sys.path`` (and ``PYTHONPATH``), so vLLM runs from the reorganised copy and the
plugin reads its files, as it would read a newer vLLM.

- ``engine``: ``LLM(...)`` builds the tiny DeepSeek-V3 in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; vLLM loads the plugins itself unless
  ``VLLM_PLUGINS`` excludes ours) and generates greedily; prints the tokens, the report and
  the plugin's log lines (INFO and up).
- ``router``: masking at router level through the relocated binding site: the factory
  module's ``current_platform`` is the FAKE ``NotCpuPlatform`` proxy of
  test_router_masking (CPU-only machine: GroupedTopKRouter is only built off-CPU), mode
  forced to backport, DeepEP v2 set through vLLM's config (imported from its NEW path).

``--fused-moe``: the MoE layer package moves too (``vllm.model_executor.layers.fused_moe`` ->
``vllm.runtime.modeling.layers.fused_moe``): the router factory AND its binding site (layer.py)
live elsewhere; the plugin must find both, beside a second MoE path with its own same-named
factory and ``layer.py`` (as vLLM main's ``hw_agnostic`` has: ``reorg_tree.add_second_moe_path``).

Prints ``RESULT=<json>``.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FUSED_MOE = "vllm.model_executor.layers.fused_moe"
FUSED_MOE_NEW = "vllm.runtime.modeling.layers.fused_moe"
LAYER = f"{FUSED_MOE}.layer"
RF = f"{FUSED_MOE}.router.router_factory"
NEW_FC = "vllm.runtime.execution.forward_context"
NEW_CONFIG = "vllm.foundation.config"


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def reorganise(shim: str | None, remove: str | None, fused_moe: bool = False) -> str:
    sys.path.insert(0, str(HERE))
    import reorg_tree

    site = Path(importlib.util.find_spec("vllm").submodule_search_locations[0]).parent
    reuse = os.environ.get("REORG_ROOT")   # one tree for several runs (warm relocation cache)
    if reuse and (Path(reuse) / "vllm" / "__init__.py").is_file():
        return reuse
    root = Path(reuse) if reuse else Path(tempfile.mkdtemp(prefix="padplugin-reorg-vllm-",
                                                           dir=os.environ.get("REORG_TREE_DIR")))
    moves = reorg_tree.MAIN_MOVES + ((reorg_tree.Move(FUSED_MOE, FUSED_MOE_NEW),) if fused_moe else ())
    moves = reorg_tree.with_shims(moves, shim) if shim else moves
    reorg_tree.build(site, root, moves)
    if fused_moe:
        reorg_tree.add_second_moe_path(root)
    if remove:
        reorg_tree.remove_symbol(root, "", remove, f"{remove}_gone")
    return str(root)


def engine_run() -> dict:
    from vllm import LLM, SamplingParams

    from vllm_padplugin.tiny_model import build_tiny_model, prompt_token_ids

    llm = LLM(model=str(build_tiny_model()), skip_tokenizer_init=True, enforce_eager=True, seed=0,
              max_model_len=256, max_num_seqs=4, kv_cache_memory_bytes=64 << 20)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": prompt_token_ids(8)}, {"prompt_token_ids": prompt_token_ids(5, seed=1)}],
                        params, use_tqdm=False)
    return {"generated_token_ids": [list(o.outputs[0].token_ids) for o in outs]}


def router_run(fused_moe: bool = False) -> dict:
    import torch
    from test_router_masking import E, G, K, PAD, TOPG, NotCpuPlatform, inputs, mask

    from vllm_padplugin.router_override import is_ours

    base = FUSED_MOE_NEW if fused_moe else FUSED_MOE
    layer = importlib.import_module(LAYER.replace(FUSED_MOE, base))
    rf = importlib.import_module(RF.replace(FUSED_MOE, base))
    fc = importlib.import_module(NEW_FC)
    cfg = importlib.import_module(NEW_CONFIG)
    rf.current_platform = NotCpuPlatform(rf.current_platform)
    upstream = layer.create_fused_moe_router
    from vllm.plugins import load_general_plugins

    load_general_plugins()

    def build(factory, masking):
        conf = (cfg.VllmConfig(parallel_config=cfg.ParallelConfig(
            enable_expert_parallel=True, data_parallel_size=2, all2all_backend="deepep_v2"))
            if masking else cfg.VllmConfig())
        with cfg.set_current_vllm_config(conf):
            return factory(top_k=K, global_num_experts=E, use_grouped_topk=True, num_expert_group=G,
                           topk_group=TOPG, scoring_func="sigmoid", renormalize=True,
                           e_score_correction_bias=torch.linspace(-0.1, 0.1, E))

    h, logits = inputs()
    ours = build(layer.create_fused_moe_router, True)
    with fc.set_forward_context(None, cfg.VllmConfig(), num_tokens=h.shape[0], is_padding=mask()):
        w, ids = ours.select_experts(h, logits)[:2]
    rw, rids = build(upstream, False).select_experts(h, logits)[:2]
    pad = torch.tensor(PAD)
    return {
        "layer_factory_is_ours": is_ours(layer.create_fused_moe_router),
        "router_class": type(ours).__name__,
        "padded_rows_masked": bool(torch.all(ids[pad] == -1) and torch.all(w[pad] == 0)),
        "real_rows_equal_upstream": bool(torch.equal(w[~pad], rw[~pad]) and torch.equal(ids[~pad], rids[~pad])),
    }


def main() -> int:
    args = sys.argv[1:]
    what = args[0]
    shim = args[args.index("--shim") + 1] if "--shim" in args else None
    remove = args[args.index("--remove") + 1] if "--remove" in args else None
    fused_moe = "--fused-moe" in args
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.path.insert(0, str(HERE))
    root = reorganise(shim, remove, fused_moe)
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    handler = Lines()
    plog = logging.getLogger("vllm_padplugin")
    plog.addHandler(handler)
    plog.setLevel(logging.INFO)
    result: dict = {"what": what, "shim": shim, "root": root}
    try:
        import vllm

        result["vllm_file"] = vllm.__file__
        result["old_paths_importable"] = {
            m: importlib.util.find_spec(m) is not None
            for m in ("vllm.forward_context", "vllm.envs", "vllm.platforms", "vllm.config", FUSED_MOE)}
        result.update(engine_run() if what == "engine" else router_run(fused_moe))
    except Exception as exc:
        import traceback

        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {exc}"
    from vllm_padplugin import relocate
    from vllm_padplugin.report import build_report

    result["report"] = build_report()
    result["relocation_cache"] = dict(relocate.LAST)
    result["log"] = handler.lines
    print("RESULT=" + json.dumps(result, default=str), flush=True)
    return 3 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
