"""The 0.28-0.30 backport of upstream's padding-mask plumbing (vLLM PR #56079).

Three layers: static reads of the official release sources (``compat``: the shim is
still needed, and our capability rule picks exactly the releases before the fix),
real vLLM classes on the installed CPU build (``vllm``: 0.30 lacks the fix and gets
the backport, 0.32 has it natively and the patches report "not needed"), and the
pure-torch mask underneath (tests/test_padding_mask.py).
"""
from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import os
import threading
from pathlib import Path

import pytest
import torch

from vllm_padplugin.patches import dbo_mask, legacy_runner_mask

REPO = Path(__file__).resolve().parent.parent
RELEASES_DIR = Path(os.environ.get("PADPLUGIN_RELEASES_DIR",
                                   Path.home() / ".cache" / "vllm_padplugin" / "releases"))


def _supported_releases() -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location("_vllm_releases", REPO / "ci" / "vllm_releases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return tuple(mod.RELEASES)


RELEASES = _supported_releases()
LOWEST = RELEASES[0]
FIX = (0, 31)   # vLLM PR #56079


def _ver(v: str) -> tuple[int, int]:
    major, minor = v.split(".")[:2]
    return int(major), int(minor)


def _tree(version: str) -> Path:
    root = RELEASES_DIR / version / "vllm"
    if not root.is_dir():
        pytest.skip(f"vLLM {version} sources absent under {RELEASES_DIR} (run ci/vllm_releases.py)")
    return root


def _class(path: Path, name: str) -> ast.ClassDef | None:
    if not path.exists():
        return None
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _params(fn: ast.FunctionDef) -> set[str]:
    a = fn.args
    return {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}


def _passes_is_padding(fn: ast.FunctionDef, callee: str) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == callee:
            if any(k.arg == "is_padding" for k in node.keywords):
                return True
    return False


# --------------------------------------------------------------------- compat (static)


@pytest.mark.compat
def test_lowest_supported_release_still_lacks_the_runner_mask():
    """The legacy runner of the lowest supported vLLM still never fills is_padding.

    FAILS on purpose once ci/vllm_releases.py RELEASES starts at 0.31 or later: then
    every supported vLLM fills the mask itself and patches/legacy_runner_mask.py
    (with this test) must be deleted.
    """
    runner = _class(_tree(LOWEST) / "v1/worker/gpu_model_runner.py", "GPUModelRunner")
    assert runner is not None, f"vLLM {LOWEST} has no legacy runner: delete legacy_runner_mask"
    assert _method(runner, legacy_runner_mask.NATIVE_METHOD) is None, (
        f"vLLM {LOWEST} fills is_padding natively: delete patches/legacy_runner_mask.py")
    assert not _passes_is_padding(_method(runner, "execute_model"), "set_forward_context")


@pytest.mark.compat
def test_lowest_supported_release_still_lacks_dbo_propagation():
    """The DBO wrapper of the lowest supported vLLM still builds micro-batch contexts
    without is_padding.

    FAILS on purpose once the supported range starts at 0.31 or later: then delete
    patches/dbo_mask.py and this test.
    """
    wrapper = _class(_tree(LOWEST) / "v1/worker/gpu_ubatch_wrapper.py", "UBatchWrapper")
    assert wrapper is not None, f"vLLM {LOWEST} has no UBatchWrapper: delete dbo_mask"
    builder = _method(wrapper, dbo_mask.METHOD)
    assert "is_padding" not in _params(builder), f"vLLM {LOWEST} propagates: delete patches/dbo_mask.py"
    assert not _passes_is_padding(builder, "create_forward_context")


@pytest.mark.parametrize("version", RELEASES)
def test_capability_rule_selects_exactly_the_releases_before_the_fix(version):
    """Our patches detect the fix by capability (_prepare_padding_mask; an is_padding
    parameter of the builder); on every release that rule must agree with whether
    upstream's code actually passes is_padding."""
    root = _tree(version)
    runner = _class(root / "v1/worker/gpu_model_runner.py", "GPUModelRunner")
    wrapper = _class(root / "v1/worker/gpu_ubatch_wrapper.py", "UBatchWrapper")
    if runner is None and wrapper is None:
        assert _ver(version) >= (0, 34), "legacy runner vanished before 0.34?"
        return
    fixed = _ver(version) >= FIX
    assert (_method(runner, legacy_runner_mask.NATIVE_METHOD) is not None) == fixed
    assert _passes_is_padding(_method(runner, "execute_model"), "set_forward_context") == fixed
    assert _passes_is_padding(_method(runner, "_dummy_run"), "set_forward_context") == fixed
    builder = _method(wrapper, dbo_mask.METHOD)
    assert ("is_padding" in _params(builder)) == fixed
    assert _passes_is_padding(builder, "create_forward_context") == fixed
    # What both patches rely on, in every release they apply to:
    sfc = next(n for n in ast.walk(ast.parse((root / "forward_context.py").read_text()))
               if isinstance(n, ast.FunctionDef) and n.name == "set_forward_context")
    assert "is_padding" in _params(sfc) and "num_tokens" in _params(sfc) and "ubatch_slices" in _params(sfc)
    dummy = _method(runner, "_dummy_run")
    assert {"num_tokens", "is_profile"} <= _params(dummy)


@pytest.mark.parametrize("version", RELEASES)
def test_v2_runner_dbo_needs_no_backport(version):
    """The v2 runner's DBO either does not exist (0.28/0.29) or passes each micro-batch
    its is_padding slice natively (0.30+), so nothing of ours covers it."""
    root = _tree(version)
    ubatch = root / "v1/worker/gpu/ubatch_utils.py"
    if not ubatch.exists():
        assert _ver(version) < (0, 30)
        for src in (root / "v1/worker/gpu").rglob("*.py"):       # no micro-batching anywhere in v2
            text = src.read_text()
            assert "UBatchWrapper" not in text and "make_ubatch_contexts" not in text, src
        text = (root / "v1/worker/gpu/model_runner.py").read_text().lower()
        assert "ubatch" not in text and "dbo" not in text
        return
    runner_cls = _class(ubatch, "UBatchRunner")
    assert runner_cls is not None
    assert _passes_is_padding(_method(runner_cls, "_make_forward_contexts"), "create_forward_context")


# --------------------------------------------------------------------- real vLLM


@pytest.fixture(scope="module")
def vllm_config():
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig

    return VllmConfig()


def _ubatch_wrapper(module, vllm_config):
    """A real UBatchWrapper (subclass, so patching stays local to the test) built
    WITHOUT its __init__: that one needs CUDA streams and SM control (fake: streams are None)."""
    sub = type("UBatchWrapperUnderTest", (module.UBatchWrapper,), {})
    w = object.__new__(sub)
    w.vllm_config, w.comm_stream, w.ready_barrier = vllm_config, None, threading.Barrier(3)
    return sub, w


def _micro_batch_contexts(wrapper, vllm_config, outer_mask, slices, num_tokens):
    """Run the real _make_ubatch_metadata inside a real outer forward context."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import set_forward_context

    ids = torch.arange(num_tokens)
    # 0.31+ takes the mask as a parameter (read by __call__ from the outer context)
    extra = {"is_padding": outer_mask} if dbo_mask.builder_propagates(type(wrapper)) else {}
    with set_forward_context(None, vllm_config, num_tokens=num_tokens, ubatch_slices=slices,
                             is_padding=outer_mask):
        metadata = wrapper._make_ubatch_metadata(
            ubatch_slices=slices, attn_metadata=None, slot_mapping=None, input_ids=ids,
            positions=ids.clone(), inputs_embeds=None, intermediate_tensors=None,
            compute_stream=None, dp_metadata=[None] * len(slices), batch_descriptor=None,
            cudagraph_runtime_mode=CUDAGraphMode.NONE, **extra)
    return [m.context.forward_context for m in metadata]


@pytest.mark.vllm
def test_dbo_micro_batches_get_their_slice_of_the_mask(vllm_config):
    """Real UBatchWrapper._make_ubatch_metadata, real create_forward_context, real
    UBatchSlice objects; only the wrapper's CUDA streams are faked (None).
    0.30: upstream leaves micro-batch masks None and the patch fills them;
    0.31+: upstream slices natively and the patch reports not needed ([])."""
    import vllm.v1.worker.gpu_ubatch_wrapper as module
    from vllm.v1.worker.ubatch_utils import UBatchSlice

    from vllm_padplugin.padding_mask import PaddingMask

    sub, wrapper = _ubatch_wrapper(module, vllm_config)
    outer = PaddingMask(32, "cpu").prepare(11, 16)          # rows 11..15 are padding
    slices = [UBatchSlice(slice(0, 2), slice(0, 8)), UBatchSlice(slice(2, 3), slice(8, 16))]
    native = dbo_mask.builder_propagates(module.UBatchWrapper)

    before = _micro_batch_contexts(wrapper, vllm_config, outer, slices, 16)
    sites = dbo_mask.patch_ubatch_wrapper(module, sub)
    if native:
        assert sites == [], "upstream propagates: the patch must report not needed"
        got = before
    else:
        assert [c.is_padding for c in before] == [None, None], "0.28-0.30 lose the mask (the gap)"
        assert sites == [f"{sub.__module__}.{sub.__qualname__}._make_ubatch_metadata"]
        assert dbo_mask.patch_ubatch_wrapper(module, sub) == [], "second patch must be a no-op"
        got = _micro_batch_contexts(wrapper, vllm_config, outer, slices, 16)
    for ctx, s in zip(got, slices):
        assert torch.equal(ctx.is_padding, outer[s.token_slice])
        assert ctx.is_padding.data_ptr() == outer.data_ptr() + s.token_slice.start, "view, not copy"
    assert not got[0].is_padding.any() and got[1].is_padding.tolist() == [False] * 3 + [True] * 5
    # upstream's own class is untouched by patching the subclass
    assert not legacy_runner_mask._is_ours(inspect.getattr_static(module.UBatchWrapper, "_make_ubatch_metadata"))


@pytest.mark.vllm
def test_dbo_patch_without_outer_mask_and_never_overrides(vllm_config):
    """No outer mask: micro-batches stay None. A mask already on a micro-batch context
    (upstream's own) is kept. Real wrapper/contexts; CUDA streams faked (None)."""
    import vllm.v1.worker.gpu_ubatch_wrapper as module
    from vllm.v1.worker.ubatch_utils import UBatchSlice

    if dbo_mask.builder_propagates(module.UBatchWrapper):
        pytest.skip(f"vLLM {_vllm_version()} propagates natively: the patch is not applied")
    sub, wrapper = _ubatch_wrapper(module, vllm_config)
    dbo_mask.patch_ubatch_wrapper(module, sub)
    slices = [UBatchSlice(slice(0, 1), slice(0, 4)), UBatchSlice(slice(1, 2), slice(4, 8))]
    assert [c.is_padding for c in _micro_batch_contexts(wrapper, vllm_config, None, slices, 8)] == [None, None]

    from vllm.config import CUDAGraphMode

    ids = torch.arange(8)
    metadata = module.UBatchWrapper._make_ubatch_metadata(   # unpatched upstream builder
        wrapper, ubatch_slices=slices, attn_metadata=None, slot_mapping=None, input_ids=ids,
        positions=ids, inputs_embeds=None, intermediate_tensors=None, compute_stream=None,
        dp_metadata=[None, None], batch_descriptor=None, cudagraph_runtime_mode=CUDAGraphMode.NONE)
    own = torch.ones(4, dtype=torch.bool)
    metadata[0].context.forward_context.is_padding = own
    outer = torch.tensor([False] * 6 + [True] * 2)
    assert dbo_mask.propagate(metadata, slices, outer) == 1
    assert metadata[0].context.forward_context.is_padding is own
    assert metadata[1].context.forward_context.is_padding.tolist() == [False, False, True, True]


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


@pytest.mark.vllm
def test_legacy_runner_patch_is_applied_only_before_the_fix():
    """Capability, not version: the real GPUModelRunner of 0.31+ has _prepare_padding_mask
    and patch_legacy_runner leaves it (and the module's set_forward_context) alone."""
    import vllm.v1.worker.gpu_model_runner as module

    native = legacy_runner_mask.runner_fills_mask(module.GPUModelRunner)
    assert native == (_ver(_vllm_version()) >= FIX)
    if native:
        original = module.set_forward_context
        assert legacy_runner_mask.patch_legacy_runner(module) == []
        assert module.set_forward_context is original


@pytest.fixture
def patched_runner(monkeypatch, vllm_config):
    """A subclass of the real GPUModelRunner, patched by patch_legacy_runner.

    FAKE (unavoidable without CUDA and a model): the instance skips __init__ (only
    max_num_tokens and device are set) and execute_model/_dummy_run are stand-ins that
    call the runner module's set_forward_context the way upstream's bodies do (same
    keywords); _dummy_run carries upstream's real signature, so is_profile is bound
    exactly as upstream defines it. The module's set_forward_context is restored after.
    """
    import vllm.v1.worker.gpu_model_runner as module

    if legacy_runner_mask.runner_fills_mask(module.GPUModelRunner):
        pytest.skip(f"vLLM {_vllm_version()} fills is_padding natively (patch not needed)")
    monkeypatch.setattr(module, "set_forward_context", module.set_forward_context)
    seen: list = []

    def forward(num_tokens, ubatch_slices=None, **extra):
        from vllm.forward_context import get_forward_context

        with module.set_forward_context(None, vllm_config, num_tokens=num_tokens,
                                        ubatch_slices=ubatch_slices, **extra):
            mask = get_forward_context().is_padding     # a view: later steps refill it
            seen.append(None if mask is None else (mask.clone(), mask.data_ptr()))

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        forward(self.pad_to)

    def _dummy_run(self, num_tokens, *args, **kwargs):
        per_ubatch, slices = getattr(self, "dbo", (num_tokens, None))
        forward(per_ubatch, slices)

    _dummy_run.__signature__ = inspect.signature(module.GPUModelRunner._dummy_run)
    sub = type("GPUModelRunnerUnderTest", (module.GPUModelRunner,),
               {"execute_model": execute_model, "_dummy_run": _dummy_run})
    sites = legacy_runner_mask.patch_legacy_runner(module, sub)
    assert sites == [f"{sub.__module__}.{sub.__qualname__}.execute_model",
                     f"{sub.__module__}.{sub.__qualname__}._dummy_run",
                     f"{module.__name__}.set_forward_context"]
    assert legacy_runner_mask.patch_legacy_runner(module, sub) == [], "second patch must be a no-op"
    runner = object.__new__(sub)
    runner.max_num_tokens, runner.device = 32, torch.device("cpu")
    return runner, seen, module


def _step(n: int):
    from vllm.v1.core.sched.output import SchedulerOutput

    return dataclasses.replace(SchedulerOutput.make_empty(), total_num_scheduled_tokens=n)


@pytest.mark.vllm
def test_legacy_runner_fills_the_persistent_mask_each_step(patched_runner, vllm_config):
    runner, seen, module = patched_runner
    runner.pad_to = 8
    runner.execute_model(_step(5))                 # 5 real tokens padded to a graph size of 8
    runner.pad_to = 16
    runner.execute_model(_step(16))                # no padding
    runner.pad_to = 4
    runner.execute_model(scheduler_output=_step(3))
    assert [m.tolist() for m, _ in seen] == [[False] * 5 + [True] * 3, [False] * 16, [False] * 3 + [True]]
    buffer = runner.__dict__[legacy_runner_mask.MASK_ATTR].buffer
    assert buffer.shape == (32,) and buffer.dtype == torch.bool
    assert {p for _, p in seen} == {buffer.data_ptr()}, "one persistent buffer, no allocation"

    # outside a runner step the module's set_forward_context passes through untouched
    from vllm.forward_context import get_forward_context

    with module.set_forward_context(None, vllm_config, num_tokens=8):
        assert get_forward_context().is_padding is None
    explicit = torch.zeros(8, dtype=torch.bool)
    runner.pad_to = 8
    with module.set_forward_context(None, vllm_config, num_tokens=8, is_padding=explicit):
        assert get_forward_context().is_padding is explicit


@pytest.mark.vllm
def test_legacy_runner_dummy_runs_follow_upstream(patched_runner):
    """As 0.31: a dummy run is all padding, a profile run has none, and a DBO dummy run
    (num_tokens of one micro-batch, slices over the whole batch) covers every slice."""
    from vllm.v1.worker.ubatch_utils import UBatchSlice

    runner, seen, _ = patched_runner
    runner._dummy_run(6)
    runner._dummy_run(6, is_profile=True)
    slices = [UBatchSlice(slice(0, 1), slice(0, 8)), UBatchSlice(slice(1, 2), slice(8, 16))]
    runner.dbo = (8, slices)        # upstream passes one micro-batch's count as num_tokens
    runner._dummy_run(16)
    assert [m.tolist() for m, _ in seen] == [[True] * 6, [False] * 6, [True] * 16]


@pytest.mark.vllm
def test_legacy_runner_batch_larger_than_the_mask_is_not_masked(patched_runner):
    """One warning (logged once per process) and an unmasked forward, never an error."""
    runner, seen, _ = patched_runner
    runner.pad_to = 64                                   # > max_num_tokens (32)
    runner.execute_model(_step(40))
    assert seen == [None]


_APPLY_SCRIPT = r"""
import json, sys
from vllm_padplugin.patches import dbo_mask, legacy_runner_mask
from vllm_padplugin.patches.base import Env
assert "vllm" not in sys.modules, "patch modules must not import vLLM at import time"
env = Env(vllm_version="?", device_type=sys.argv[1], mode=sys.argv[2], strict=True)
out = {}
for p in (legacy_runner_mask.PATCH, dbo_mask.PATCH):
    out[p.name] = {"needed": p.needed(env), "returned": p.apply(env) if p.needed(env) else None}
import vllm.v1.worker.gpu_model_runner, vllm.v1.worker.gpu_ubatch_wrapper   # fires the hooks
out["applied"] = legacy_runner_mask.APPLIED + dbo_mask.APPLIED
print("RESULT" + json.dumps(out))
"""


def _apply_in_subprocess(device_type: str, mode: str) -> dict:
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _APPLY_SCRIPT, device_type, mode],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "VLLM_PLUGINS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.mark.vllm
def test_apply_patches_lazily_on_import_and_only_where_needed():
    """PATCH.apply through a post-import hook on the real modules (fresh process, so the
    real classes may be patched; device type forced to "cuda", the only fake here).
    0.30: the hooks patch execute_model, _dummy_run, set_forward_context and
    _make_ubatch_metadata when vLLM imports them; 0.31+: nothing (native)."""
    out = _apply_in_subprocess("cuda", "backport")
    assert out["legacy_runner_mask"]["returned"] == [f"{legacy_runner_mask.RUNNER.module} (on import)"]
    assert out["dbo_mask"]["returned"] == [f"{dbo_mask.BUILDER.module} (on import)"]
    if _ver(_vllm_version()) >= FIX:
        assert out["applied"] == []
    else:
        assert out["applied"] == [
            "vllm.v1.worker.gpu_model_runner.GPUModelRunner.execute_model",
            "vllm.v1.worker.gpu_model_runner.GPUModelRunner._dummy_run",
            "vllm.v1.worker.gpu_model_runner.set_forward_context",
            "vllm.v1.worker.gpu_ubatch_wrapper.UBatchWrapper._make_ubatch_metadata",
        ]


@pytest.mark.parametrize("device_type,mode", [("cpu", "backport"), ("cuda", "native"),
                                              ("hpu", "hpu-noop"), ("cuda", "passthrough")])
def test_not_needed_off_cuda_backport(device_type, mode):
    from vllm_padplugin.patches.base import Env

    env = Env(vllm_version="0.30.0", device_type=device_type, mode=mode, strict=False)
    assert not legacy_runner_mask.PATCH.needed(env) and not dbo_mask.PATCH.needed(env)


_ENGINE_SCRIPT = r"""
import json, os, sys
if __name__ == "__main__":
    from vllm_padplugin.tiny_model import build_tiny_model, prompt_token_ids
    model_dir = build_tiny_model()
    import torch
    import vllm.v1.worker.gpu_model_runner as runner_module
    from vllm_padplugin.patches import legacy_runner_mask
    sites = legacy_runner_mask.patch_legacy_runner(runner_module)   # forced: the platform is CPU
    from vllm import LLM, SamplingParams
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True, seed=0,
              max_model_len=128, max_num_seqs=2, kv_cache_memory_bytes=64 << 20)
    seen = []

    def install(model):
        from vllm.forward_context import get_forward_context
        def pre_hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            mask = get_forward_context().is_padding
            seen.append(None if mask is None else
                        {"n": int(ids.shape[0]), "len": int(mask.shape[0]), "padded": int(mask.sum()),
                         "ptr": mask.data_ptr(), "dtype": str(mask.dtype)})
        model.register_forward_pre_hook(pre_hook, with_kwargs=True)
        return type(model).__mro__[0].__module__

    llm.apply_model(install)
    runner_cls = type(llm.llm_engine.model_executor.driver_worker.worker.model_runner) \
        if hasattr(llm.llm_engine, "model_executor") else None
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": prompt_token_ids(7)}, {"prompt_token_ids": prompt_token_ids(5, seed=1)}],
                 params, use_tqdm=False)
    steps = len(seen)
    # upstream's real _dummy_run: a plain dummy batch is all padding, a profile run has none
    llm.collective_rpc(lambda worker: worker.model_runner._dummy_run(6))
    llm.collective_rpc(lambda worker: worker.model_runner._dummy_run(6, is_profile=True))
    print("RESULT" + json.dumps({"sites": sites, "seen": seen[:steps], "dummy": seen[steps:],
                                 "runner_mro": [c.__name__ for c in runner_cls.__mro__] if runner_cls else None}))
"""


@pytest.mark.vllm
@pytest.mark.e2e
@pytest.mark.slow
def test_real_cpu_runner_forwards_carry_the_mask(tmp_path):
    """The real legacy runner body (vLLM CPU's CPUModelRunner inherits GPUModelRunner's
    execute_model/_dummy_run and calls the runner module's set_forward_context) runs a
    tiny DeepSeek-V3 with the legacy-runner patch FORCED on (the platform is CPU, not
    CUDA: the only fake). Every forward the model sees must carry is_padding: from our
    persistent buffer on 0.30 (one address), from upstream's on 0.31+ (patch: not needed).
    CPU runs eagerly without graph padding, so every row of a generation step is real;
    the real _dummy_run (called through collective_rpc) gives an all-padding mask, or none
    padded with is_profile=True, as upstream 0.31 does."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_PLUGINS": "",
           "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", _ENGINE_SCRIPT], capture_output=True, text=True,
                          timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))[6:])
    native = _ver(_vllm_version()) >= FIX
    assert (out["sites"] == []) == native
    seen = out["seen"]
    assert len(seen) >= 4, seen                                  # prefill + decode steps
    assert all(s is not None for s in seen), f"a forward without is_padding: {seen}"
    assert all(s["len"] == s["n"] and s["padded"] == 0 and s["dtype"] == "torch.bool" for s in seen), seen
    dummy = out["dummy"]
    assert [(d["n"], d["len"], d["padded"]) for d in dummy] == [(6, 6, 6), (6, 6, 0)], dummy
    assert len({s["ptr"] for s in seen + dummy}) == 1, "the mask must live in one persistent buffer"
