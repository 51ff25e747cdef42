"""vLLM main's ROUTING changes, as recorded from its snapshots, against the plugin.

The facts are in tests/fixtures/reorg/main_facts.json, key ``"routing"`` (read with the
search tools off stored snapshots of vllm-project/vllm, each with the commit and file it
came from).  What they say, and what is checked here:

1. ``GroupedTopKRouter.__init__`` and ``create_fused_moe_router`` have no ``skip_padding``;
   the grouped top-k path masks nothing.
2. Upstream masks padded rows only inside ``ops.topk_softmax`` / ``ops.topk_sigmoid`` (the
   ``_get_padding_mask`` helper of fused_topk_router.py / fused_topk_bias_router.py: the
   ``VLLM_MOE_SKIP_PADDING`` env var and the forward context's ``is_padding``, no all2all
   condition), i.e. for the non-grouped routers (and the grouped router's fallback).
   -> the plugin must decide "backport" for main on CUDA (its grouped routers are not
   masked upstream), mask only grouped routers, and leave every other row bit-identical.
3. ``BaseRouter._compute_routing`` takes a keyword-only ``input_ids=None``.
   -> the plugin's ``_compute_routing`` wrapper must hand it through.
4. ``create_fused_moe_router`` lost ``capture`` and gained ``zero_expert_type``,
   ``num_logical_experts``, ``hash_indices_table``.
   -> the factory override must have exactly that signature (+ ``skip_padding``).

FAKE, only for what does not exist on this machine, vLLM main itself:
- main's factory: a function whose signature is built from the recorded parameter list
  (``compat_utils.fake_function``); in the end-to-end test its body builds the router with
  the REAL vLLM 0.32 factory (which takes every parameter main's does);
- main's ``_compute_routing`` / ``GroupedTopKRouter.__init__``: a method / class built from
  the recorded parameter lists;
- main's router_factory.py / grouped_topk_router.py sources: stubs (the recorded
  parameters, no body), for the decisions that read sources.
Real: the plugin's ``wrap_factory``, ``install_mask``, ``upstream_masks_natively``,
``decide_mode``, ``should_mask`` and ``compat``; vLLM 0.32's ``GroupedTopKRouter``, its
factory, ``select_experts``, forward context and configs (tests marked ``vllm``).
"""
from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
from compat_helpers import FX
from test_router_masking import (  # the router's shape, the GPU-platform proxy, the DeepEP v2 config, the row check
    PAD,
    TOPG,
    E,
    G,
    H,
    K,
    NotCpuPlatform,
    T,
    assert_masked_rows_only,
    deepep_v2_config,
)

from vllm_padplugin import platforms, relocate, routing, state
from vllm_padplugin.compat_utils import fake_function
from vllm_padplugin.router_override import FACTORY_MODULE, FACTORY_NAME, should_mask, wrap_factory

FACTS = Path(__file__).resolve().parent / "fixtures" / "reorg" / "main_facts.json"
ROUTING = json.loads(FACTS.read_text())["routing"]
RF = FACTORY_MODULE
GTR = "vllm.model_executor.layers.fused_moe.router.grouped_topk_router"
ROUTER_DIR = "vllm/model_executor/layers/fused_moe/router"
P = inspect.Parameter
KINDS = {"positional_or_keyword": P.POSITIONAL_OR_KEYWORD, "keyword_only": P.KEYWORD_ONLY}
NEW_FACTORY_PARAMS = ("zero_expert_type", "num_logical_experts", "hash_indices_table")

class Default:
    """Stands for one parameter's default: the facts record THAT main has one, not its value."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<default of {self.name}>"


def factory_facts() -> list[dict]:
    return ROUTING["router_factory"]["params"]


def names(params: list[dict]) -> list[str]:
    return [p["name"] for p in params]


def signature(params: list[dict], *, self_first: bool = False, none_defaults: bool = False) -> inspect.Signature:
    """The recorded parameter list as an inspect.Signature: one distinct ``Default`` object per
    default (``none_defaults``: None instead, for a method that is called)."""
    out = [P("self", P.POSITIONAL_OR_KEYWORD)] if self_first else []
    out += [P(p["name"], KINDS[p["kind"]],
              default=(None if none_defaults else Default(p["name"])) if p["default"] else P.empty)
            for p in params]
    return inspect.Signature(out)


def main_factory(calls: list, body=None):
    """FAKE main ``create_fused_moe_router``: the recorded signature; records what it is given."""
    def run(**kw):
        calls.append(kw)
        return body(**kw) if body else "router"

    f = fake_function(signature(factory_facts()), FACTORY_NAME, run)
    f.__module__ = FACTORY_MODULE    # where main keeps it (the registry's path): upstream's factory
    return f


def source_params(params: list[dict], extra: tuple[str, ...] = ()) -> str:
    """A ``def``'s parameter list with the recorded names / kinds / defaults (stub sources)."""
    out, star = [], False
    for p in [*params, *({"name": n, "kind": "positional_or_keyword", "default": True} for n in extra)]:
        if p["kind"] == "keyword_only" and not star:
            out.append("*")
            star = True
        out.append(p["name"] + ("=None" if p["default"] else ""))
    return ", ".join(out)


def write_main_router_sources(router_dir: Path, extra: tuple[str, ...] = (), factory_extra: tuple[str, ...] = (),
                              base: str = "") -> None:
    """Stub router_factory.py / grouped_topk_router.py written from the facts (no upstream code).
    ``extra`` / ``factory_extra``: parameters appended to the router's / factory's list (controls);
    ``base``: "module.Class" the stub router derives from."""
    router_dir.mkdir(parents=True, exist_ok=True)
    (router_dir / "router_factory.py").write_text(
        f"def create_fused_moe_router({source_params(factory_facts(), factory_extra)}):\n    return None\n")
    head, bases = "", ""
    if base:
        module, _, name = base.rpartition(".")
        head, bases = f"from {module} import {name}\n\n\n", f"({name})"
    init = source_params(ROUTING["grouped_topk_router"]["init_params"], extra)
    compute = source_params(ROUTING["compute_routing"]["params"])
    (router_dir / "grouped_topk_router.py").write_text(
        f"{head}class GroupedTopKRouter{bases}:\n"
        f"    def __init__(self, {init}):\n        pass\n\n"
        f"    def _compute_routing(self, {compute}):\n        return None\n")


@pytest.fixture
def own_state(monkeypatch):
    """Fresh plugin state; no env knob of ours or upstream's leaks in."""
    monkeypatch.setattr(state, "STATE", state.PluginState())
    for k in ("PADPLUGIN_FORCE_MODE", "PADPLUGIN_REPORT_DIR", "PADPLUGIN_STRICT", "PADPLUGIN_FUSED_TOPK",
              "PADPLUGIN_MASK_KERNEL", "VLLM_MOE_SKIP_PADDING"):
        monkeypatch.delenv(k, raising=False)
    return state.STATE


# -- the facts themselves -------------------------------------------------------------------

def test_routing_facts_name_commit_and_file():
    sha = re.compile(r"^[0-9a-f]{40}$")
    for key in ("router_factory", "grouped_topk_router", "compute_routing"):
        sec = ROUTING[key]
        assert sec["file"].startswith(ROUTER_DIR + "/") and sec["file"].endswith(".py"), key
        assert sha.match(sec["commit"]) and sec["commit"] in sec["read_at"], key
        assert all(sha.match(c) for c in sec["read_at"]), key
    helper = ROUTING["padding_mask_helper"]
    assert set(helper["files"]) == {f"{ROUTER_DIR}/fused_topk_router.py", f"{ROUTER_DIR}/fused_topk_bias_router.py"}
    assert all(sha.match(c) for commits in helper["files"].values() for c in commits)
    assert ROUTING["not_verified"] and all(isinstance(x, str) and x for x in ROUTING["not_verified"])


def test_routing_facts_say_what_the_checks_rely_on():
    """The four changes, as recorded (a wrong or dropped entry fails here first)."""
    fac, gtr = ROUTING["router_factory"], ROUTING["grouped_topk_router"]
    got = names(fac["params"])
    assert "skip_padding" not in got and not fac["has_skip_padding"] and not fac["has_var_keyword"]
    assert "capture" not in got and "capture" in fac["removed"]
    for n in NEW_FACTORY_PARAMS:
        assert n in got and n in fac["added"], n
    assert len(set(got)) == len(got) and got[:2] == ["top_k", "global_num_experts"]
    assert "skip_padding" not in names(gtr["init_params"]) and not gtr["has_skip_padding"]
    assert gtr["masks_grouped_path"] is False
    helper = ROUTING["padding_mask_helper"]
    assert helper["env"] == "VLLM_MOE_SKIP_PADDING" and helper["forward_context_field"] == "is_padding"
    assert helper["all2all_backend_condition"] is None
    cr = {p["name"]: p for p in ROUTING["compute_routing"]["params"]}
    assert cr["input_ids"]["kind"] == "keyword_only" and cr["input_ids"]["default"]


# -- 4: factory override parity ------------------------------------------------------------

def test_factory_override_has_main_signature_plus_skip_padding(own_state, monkeypatch):
    monkeypatch.setenv("PADPLUGIN_FORCE_MODE", "passthrough")   # nothing but the wrapper itself
    calls: list = []
    upstream = main_factory(calls)
    ours = wrap_factory(upstream)
    up_params = list(inspect.signature(upstream).parameters.values())
    got = list(inspect.signature(ours).parameters.values())
    assert got[:-1] == up_params, "main's parameters, in order, same kinds and defaults"
    extra = got[-1]
    assert (extra.name, extra.kind, extra.default, extra.annotation) == (
        "skip_padding", P.POSITIONAL_OR_KEYWORD, False, bool)
    assert "capture" not in inspect.signature(ours).parameters
    for n in NEW_FACTORY_PARAMS:
        assert inspect.signature(ours).parameters[n].kind is P.POSITIONAL_OR_KEYWORD

    # every parameter by position reaches main's factory under its own name
    values = [object() for _ in up_params]
    ours(*values)
    assert calls[-1] == {p.name: v for p, v in zip(up_params, values)}
    # the three new ones by keyword, skip_padding accepted and not passed to a factory without it
    table = torch.arange(4)
    ours(top_k=2, global_num_experts=16, zero_expert_type="identity", num_logical_experts=12,
         hash_indices_table=table, skip_padding=True)
    assert calls[-1]["zero_expert_type"] == "identity" and calls[-1]["num_logical_experts"] == 12
    assert calls[-1]["hash_indices_table"] is table and "skip_padding" not in calls[-1]
    # a removed parameter is the same TypeError as upstream's
    with pytest.raises(TypeError, match="capture"):
        upstream(2, 16, capture=None)
    with pytest.raises(TypeError, match="capture"):
        ours(2, 16, capture=None)


# -- 1 + 2: native or backport -------------------------------------------------------------

@pytest.mark.parametrize("extra,factory_extra,expect", [
    ((), (), False),                                  # main, as recorded
    (("skip_padding",), ("skip_padding",), True),     # control: 0.31+ shape
    ((), ("skip_padding",), False),                   # only the factory: upstream still does not mask grouped
], ids=["main", "control-0.31-shape", "factory-only"])
def test_mode_for_main_from_sources(own_state, monkeypatch, tmp_path, extra, factory_extra, expect):
    """Before fused_moe is imported the decision reads sources: a FAKE ``vllm`` module object
    points at stub router files written from the facts."""
    write_main_router_sources(tmp_path / "vllm" / ROUTER_DIR.partition("/")[2], extra, factory_extra)
    monkeypatch.setenv("PADPLUGIN_INSTALL_CACHE", "0")        # no cache entry for this stub tree
    monkeypatch.setattr(relocate, "_INSTALLED", None)         # resolved for the stub tree, restored after
    fake = types.ModuleType("vllm")
    fake.__file__ = str(tmp_path / "vllm" / "__init__.py")
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.delitem(sys.modules, RF, raising=False)
    assert platforms.upstream_masks_natively() is expect
    assert platforms.decide_mode("cuda") == ("native" if expect else "backport")
    for other in ("cpu", "rocm", "xpu"):
        assert platforms.decide_mode(other) == "passthrough"


def test_mode_for_main_from_live_objects(own_state, monkeypatch):
    """Once the factory module is imported the decision asks the live objects (FAKE ones with
    main's recorded signatures, wrapped by us as at run time)."""
    gtr = ROUTING["grouped_topk_router"]

    def router_class(extra=()):
        params = gtr["init_params"] + [{"name": n, "kind": "positional_or_keyword", "default": True} for n in extra]
        init = fake_function(signature(params, self_first=True), "__init__", lambda **kw: None)
        return type("GroupedTopKRouter", (), {"__init__": init, "__module__": GTR})

    factory = wrap_factory(main_factory([]))       # what resolve() finds after our patch: our wrapper
    assert "skip_padding" in inspect.signature(factory).parameters   # ours has it; upstream's has not
    monkeypatch.setitem(sys.modules, RF, types.ModuleType(RF))
    objs = {"router_factory": factory, "grouped_topk_router": router_class()}
    monkeypatch.setattr(platforms, "resolve", lambda key: objs.get(key))
    assert platforms.upstream_masks_natively() is False
    assert platforms.decide_mode("cuda") == "backport"
    objs["grouped_topk_router"] = router_class(("skip_padding",))   # the router alone is not enough
    assert platforms.upstream_masks_natively() is False


def test_static_compat_of_main_router_files_is_backport(tmp_path):
    """``vllm-padplugin compat`` on the compat fixture tree with its router files written from
    the facts (the rest is the fixture's): backport mode, no breaking drift, the missing
    skip_padding reported as supplied by the backport."""
    from vllm_padplugin.cli.compat import run_compat

    t = tmp_path / "main"
    shutil.copytree(FX / "vllm_base", t)
    write_main_router_sources(t / ROUTER_DIR, base="vllm.model_executor.layers.fused_moe.router.base_router.BaseRouter")
    out, code = run_compat(vllm_src=t, fmt="json")
    doc = json.loads(out)
    assert code == 0 and doc["breaking"] == 0 and doc["mode"] == "backport", doc["findings"]
    skip = [f for f in doc["findings"] if "skip_padding" in f["detail"]]
    assert {f["symbol"].rpartition(".")[2] for f in skip} == {"create_fused_moe_router", "GroupedTopKRouter"}
    assert all(f["severity"] == "info" and "backport supplies it" in f["detail"] for f in skip)


@pytest.mark.parametrize("grouped,deepep_v2,env_on,expect", [
    (True, True, True, True),      # main's grouped routers: upstream does not mask them, we do
    (False, True, True, False),    # fused top-k routers: upstream masks them in topk_softmax/sigmoid
    (True, False, True, False),    # our contract: DeepEP v2 only
    (True, True, False, False),    # VLLM_MOE_SKIP_PADDING=0 turns ours off as it does upstream's
])
def test_backport_decision_per_router_on_main(grouped, deepep_v2, env_on, expect):
    # main's layers never pass skip_padding (the factory has none): requested is None
    assert should_mask(mode="backport", requested=None, inner_masks=False, deepep_v2=deepep_v2,
                       env_on=env_on, grouped=grouped) is expect


# -- 3 + 2: input_ids through our _compute_routing wrapper, real rows untouched ---------------

def padding(pad=PAD) -> torch.Tensor:
    return torch.tensor(pad)


def inputs():
    g = torch.Generator().manual_seed(11)
    return torch.randn(T, H, generator=g), torch.randn(T, E, generator=g), torch.randint(0, 100, (T,), generator=g)


def main_like_router(premask: bool):
    """FAKE router of main: ``_compute_routing`` with the recorded signature; plain top-k of
    sigmoid scores.  ``premask``: masks padded rows itself the way the facts say main's
    fused top-k helper does (env var + forward context ``is_padding``, ids -1, weights 0)."""
    seen: list = []

    def body(self, hidden_states, router_logits, indices_type, input_ids):
        seen.append(input_ids)
        w, ids = torch.topk(router_logits.sigmoid(), K, dim=-1)
        w, ids = w.to(torch.float32), ids.to(torch.int32)
        if premask:
            from vllm.forward_context import get_forward_context, is_forward_context_available

            if os.environ.get("VLLM_MOE_SKIP_PADDING", "1") != "0" and is_forward_context_available():
                pad = get_forward_context().is_padding
                if pad is not None:
                    rows = pad[: ids.shape[0]].unsqueeze(1)
                    w, ids = w.masked_fill(rows, 0.0), ids.masked_fill(rows, -1)
        return w, ids

    sig = signature(ROUTING["compute_routing"]["params"], self_first=True, none_defaults=True)
    method = fake_function(sig, "_compute_routing", body)
    cls = type("MainLikeRouter", (), {"_compute_routing": method})
    return cls(), seen


@pytest.mark.vllm
@pytest.mark.parametrize("premask", [False, True], ids=["grouped-path", "upstream-already-masked"])
def test_compute_routing_wrapper_forwards_input_ids(vllm, own_state, premask):
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    router, seen = main_like_router(premask)
    assert routing.install_mask(router, impl="torch") is True
    inner = router._compute_routing.__wrapped__
    assert inspect.signature(inner).parameters["input_ids"].kind is P.KEYWORD_ONLY
    h, logits, tok = inputs()

    ref_w, ref_ids = inner(h, logits, None, input_ids=tok)       # unwrapped, no forward context
    w, ids = router._compute_routing(h, logits, None, input_ids=tok)
    assert seen[-1] is tok and torch.equal(w, ref_w) and torch.equal(ids, ref_ids)
    router._compute_routing(h, logits, None)
    assert seen[-1] is None
    with pytest.raises(TypeError):                                # still keyword-only through us
        router._compute_routing(h, logits, None, tok)

    with set_forward_context(None, VllmConfig(), num_tokens=T, is_padding=padding()):
        w, ids = router._compute_routing(h, logits, None, input_ids=tok)
        if premask:     # upstream masked already: ours on top changes nothing, bit for bit
            up_w, up_ids = inner(h, logits, None, input_ids=tok)
            assert torch.equal(w.view(torch.int32), up_w.view(torch.int32)) and torch.equal(ids, up_ids)
    assert seen[-1] is tok
    assert_masked_rows_only(w, ids, ref_w, ref_ids)


def recording_grouped_router_class():
    """A subclass of vLLM 0.32's real GroupedTopKRouter whose ``_compute_routing`` has main's
    keyword-only ``input_ids`` and records it (vLLM's routing underneath)."""
    from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import GroupedTopKRouter

    class Recording(GroupedTopKRouter):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.seen: list = []

        def _compute_routing(self, hidden_states, router_logits, indices_type, *, input_ids=None):
            self.seen.append(input_ids)
            return super()._compute_routing(hidden_states, router_logits, indices_type, input_ids=input_ids)

    return Recording


def grouped_kwargs() -> dict:
    """GroupedTopKRouter arguments, by main's recorded __init__ parameter names only."""
    kw = {"top_k": K, "global_num_experts": E, "num_expert_group": G, "topk_group": TOPG, "renormalize": True,
          "scoring_func": "sigmoid", "e_score_correction_bias": torch.linspace(-0.1, 0.1, E)}
    assert set(kw) <= set(names(ROUTING["grouped_topk_router"]["init_params"]))
    return kw


@pytest.mark.vllm
def test_real_select_experts_hands_input_ids_through_our_mask(vllm, own_state):
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    Recording = recording_grouped_router_class()
    router, reference = Recording(**grouped_kwargs()), Recording(**grouped_kwargs())
    assert routing.is_grouped_router(router)
    assert routing.install_mask(router, impl="torch") is True
    h, logits, tok = inputs()
    ref_w, ref_ids = reference.select_experts(h, logits, input_ids=tok)[:2]
    with set_forward_context(None, VllmConfig(), num_tokens=T, is_padding=padding()):
        w, ids = router.select_experts(h, logits, input_ids=tok)[:2]
    assert router.seen == [tok] and router.seen[0] is tok
    assert_masked_rows_only(w, ids, ref_w, ref_ids)


# -- end to end on real vLLM 0.32: main's factory shape, our wrapper, vLLM's routers ---------

@pytest.mark.vllm
def test_main_factory_on_real_vllm_masks_grouped_only(plugin_sandbox, monkeypatch):
    """Main on CUDA is "backport" (tests above): built through our wrapper of a factory with
    main's signature (its body: vLLM 0.32's real factory, given exactly main's arguments, so
    the grouped router is built without skip_padding and masks nothing itself), grouped
    routers are masked under DeepEP v2 with real rows bit-identical, fused top-k routers
    (upstream masks those in topk_softmax/sigmoid) are left alone."""
    import importlib

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context

    rf = importlib.import_module(RF)
    monkeypatch.setattr(rf, "current_platform", NotCpuPlatform(rf.current_platform))
    for k in ("VLLM_MOE_SKIP_PADDING", "PADPLUGIN_STRICT", "PADPLUGIN_REPORT_DIR", "PADPLUGIN_FUSED_TOPK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PADPLUGIN_FORCE_MODE", "backport")
    real = rf.create_fused_moe_router
    assert set(names(factory_facts())) <= set(inspect.signature(real).parameters)
    calls: list = []
    # a parameter left at main's default (value not recorded) takes vLLM 0.32's default
    ours = wrap_factory(main_factory(calls, body=lambda **kw: real(**{
        k: v for k, v in kw.items() if not isinstance(v, Default)})))
    grouped = {"top_k": K, "global_num_experts": E, "use_grouped_topk": True, "num_expert_group": G,
               "topk_group": TOPG, "scoring_func": "sigmoid", "renormalize": True,
               "e_score_correction_bias": torch.linspace(-0.1, 0.1, E)}

    with set_current_vllm_config(deepep_v2_config()):
        router = ours(**grouped)
        ref = real(**grouped)
        bias_router = ours(top_k=K, global_num_experts=E, scoring_func="sigmoid",
                           e_score_correction_bias=torch.linspace(-0.1, 0.1, E))
    # main's shape: no skip_padding, so no native mask (vLLM 0.30's router has no such attribute at all)
    assert "skip_padding" not in calls[0] and getattr(router, "skip_padding", False) is False
    assert type(router).__name__ == "GroupedTopKRouter" and getattr(router, routing.MASKED_ATTR, False)
    assert type(bias_router).__name__ == "FusedTopKBiasRouter" and "_compute_routing" not in vars(bias_router)
    assert plugin_sandbox.masked_routers == 1

    h, logits, tok = inputs()
    ref_w, ref_ids = ref.select_experts(h, logits, input_ids=tok)[:2]
    with set_forward_context(None, VllmConfig(), num_tokens=T, is_padding=padding()):
        w, ids = router.select_experts(h, logits, input_ids=tok)[:2]
        ref_ctx_w, ref_ctx_ids = ref.select_experts(h, logits, input_ids=tok)[:2]
    assert torch.equal(ref_ctx_w, ref_w) and torch.equal(ref_ctx_ids, ref_ids)   # vLLM alone: grouped unmasked
    assert_masked_rows_only(w, ids, ref_w, ref_ids)

    with set_current_vllm_config(VllmConfig()):                                  # no DeepEP v2: not ours to mask
        plain = ours(**grouped)
    assert "_compute_routing" not in vars(plain) and plugin_sandbox.masked_routers == 1
