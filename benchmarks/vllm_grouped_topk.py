"""Load vLLM's own ``grouped_topk`` from a release's Python sources, compiled as vLLM does.

Used by ``benchmarks/gpu_masking.py`` on the GPU machine, which has no vLLM install.  We
copy no vLLM code into the repo: at run time this reads
``vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py`` (and
``vllm/model_executor/utils.py`` for ``maybe_disable_graph_partition``) from a release
tree (``--vllm-src`` dir, or a ``.tar.xz`` of those files), takes the ``grouped_topk``
function *with its decorator* (``@torch.compile(dynamic=True, backend=
current_platform.simple_compile_backend, options=maybe_disable_graph_partition(...))``)
from the AST and executes it in a namespace that supplies what it refers to:

* ``current_platform``: CUDA's values, ``simple_compile_backend = "inductor"`` (the
  platform default in vllm/platforms/interface.py), ``is_cuda() = True``;
* ``envs``: ``VLLM_BATCH_INVARIANT = False`` (default) and
  ``VLLM_USE_FUSED_MOE_GROUPED_TOPK = False``: with the default (True), bias present and
  <= 32 groups, vLLM on CUDA calls its compiled CUDA op ``ops.grouped_topk`` from
  ``vllm._moe_C`` instead, which is not in the Python sources and cannot be built on the
  lent machine, so what this times is vLLM's torch path (taken with that variable set
  to 0, for routers without a bias, or with > 32 groups), compiled by torch.compile.
"""
from __future__ import annotations

import ast
import io
import tarfile
import types
from pathlib import Path

import torch

ROUTER = "vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py"
UTILS = "vllm/model_executor/utils.py"


def _read_sources(src: str | Path) -> dict[str, str]:
    src = Path(src)
    if src.is_dir():
        return {rel: (src / rel).read_text() for rel in (ROUTER, UTILS)}
    with tarfile.open(src) as tar:  # a .tar.xz of the two files, paths as above
        out = {}
        for m in tar.getmembers():
            for rel in (ROUTER, UTILS):
                if m.name.endswith(rel):
                    out[rel] = io.TextIOWrapper(tar.extractfile(m), encoding="utf-8").read()
        return out


def _function_source(text: str, name: str) -> str:
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node, padded=False) if not node.decorator_list else "\n".join(
                text.splitlines()[node.decorator_list[0].lineno - 1 : node.end_lineno]
            )
    raise LookupError(f"no top-level function {name!r}")


def _torch_at_least(target: str) -> bool:
    from packaging.version import Version

    return Version(torch.__version__) >= Version(target)


def load(src: str | Path, *, compile_backend: str = "inductor"):
    """Return vLLM's ``grouped_topk`` (decorated, so compiled on first call) and a description."""
    texts = _read_sources(src)
    utils_ns: dict = {"is_torch_equal_or_newer": _torch_at_least}
    exec(compile(_function_source(texts[UTILS], "maybe_disable_graph_partition"), UTILS, "exec"), utils_ns)
    platform = types.SimpleNamespace(
        simple_compile_backend=compile_backend, is_cuda=lambda: True, is_xpu=lambda: False
    )
    envs = types.SimpleNamespace(VLLM_USE_FUSED_MOE_GROUPED_TOPK=False, VLLM_BATCH_INVARIANT=False)

    def _no_cuda_op(*a, **k):  # the C++ op path is switched off above; never reached
        raise RuntimeError("vLLM's CUDA grouped_topk op is not available here")

    ns = {
        "torch": torch,
        "envs": envs,
        "current_platform": platform,
        "maybe_disable_graph_partition": utils_ns["maybe_disable_graph_partition"],
        "fused_grouped_topk": _no_cuda_op,
    }
    code = _function_source(texts[ROUTER], "grouped_topk")
    exec(compile(code, ROUTER, "exec"), ns)
    opts = utils_ns["maybe_disable_graph_partition"](compile_backend)
    return ns["grouped_topk"], f"vLLM grouped_topk (torch path) under torch.compile(dynamic=True, backend={compile_backend!r}, options={opts})"
