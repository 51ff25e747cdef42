"""Signature parity of our router factory with every vLLM release and with future changes.

Release signatures are read from the official 0.28-0.34 sources WITHOUT importing
them (``compat_utils.signature_from_source``, ast).  Each is turned into a stand-in
factory function (``compat_utils.fake_function``: a real function with exactly that
signature that records its arguments; FAKE, because 0.33/0.34 cannot be installed
here), wrapped by the real ``wrap_factory``, and checked: same parameters, kinds,
defaults and annotations as upstream, plus ``skip_padding: bool = False`` where
upstream lacks it; calls reach the inner factory with only what it accepts.
"""
from __future__ import annotations

import inspect
import sys
import types

import pytest

from vllm_padplugin import state
from vllm_padplugin.compat_utils import fake_function, signature_from_source, with_parameter
from vllm_padplugin.router_override import FACTORY_MODULE, FACTORY_NAME, override_signature, wrap_factory

from conftest import RELEASES

REL_PATH = "vllm/model_executor/layers/fused_moe/router/router_factory.py"
P = inspect.Parameter


@pytest.fixture(autouse=True)
def quiet_state(monkeypatch):
    """Own plugin state; mode forced so no vLLM platform is consulted."""
    monkeypatch.setattr(state, "STATE", state.PluginState())
    monkeypatch.setenv("PADPLUGIN_FORCE_MODE", "passthrough")
    monkeypatch.delenv("PADPLUGIN_REPORT_DIR", raising=False)


def upstream_like(sig: inspect.Signature, calls: list, module: str = FACTORY_MODULE):
    """A stand-in for upstream's factory (FAKE: records its arguments, returns a token)."""
    f = fake_function(sig, FACTORY_NAME, lambda **kw: calls.append(kw) or "router")
    f.__module__ = module
    return f


def assert_parity(ours: inspect.Signature, upstream: inspect.Signature):
    up = list(upstream.parameters.values())
    got = list(ours.parameters.values())
    if "skip_padding" in upstream.parameters:
        assert got == up
    else:
        assert got[:-1] == up, "upstream parameters must be kept in order, unchanged"
        extra = got[-1]
        assert (extra.name, extra.default, extra.annotation) == ("skip_padding", False, bool)
    assert ours.return_annotation == upstream.return_annotation


@pytest.mark.parametrize("version", RELEASES)
def test_parity_with_release(releases_dir, version):
    path = releases_dir / version / REL_PATH
    if not path.exists():
        pytest.skip(f"{path} absent")
    upstream = signature_from_source(path, FACTORY_NAME)
    assert "top_k" in upstream.parameters  # the parse found the real factory
    calls: list = []
    ours = wrap_factory(upstream_like(upstream, calls))
    assert_parity(inspect.signature(ours), upstream)
    assert_parity(override_signature(upstream), upstream)
    has_skip = version >= "0.31"
    assert ("skip_padding" in upstream.parameters) == has_skip

    assert ours(4, 64, skip_padding=True, use_grouped_topk=True) == "router"
    assert calls[-1]["top_k"] == 4 and calls[-1]["use_grouped_topk"] is True
    if has_skip:
        assert calls[-1]["skip_padding"] is True
    else:
        assert "skip_padding" not in calls[-1]
    with pytest.raises(TypeError):
        ours(4, 64, no_such_parameter=1)  # a wrong call fails like upstream
    with pytest.raises(TypeError):
        ours()  # required parameters stay required


def _release_sig(releases_dir) -> inspect.Signature:
    path = releases_dir / "0.30.0" / REL_PATH
    if not path.exists():
        pytest.skip(f"{path} absent")
    return signature_from_source(path, FACTORY_NAME)


def _edit(sig: inspect.Signature, *, drop=(), rename=None, add=()) -> inspect.Signature:
    params = [p for p in sig.parameters.values() if p.name not in drop]
    if rename:
        params = [p.replace(name=rename[1]) if p.name == rename[0] else p for p in params]
    params += list(add)
    return sig.replace(parameters=params)


def test_future_kwarg_added_passes_through(releases_dir):
    sig = _edit(_release_sig(releases_dir), add=[P("routing_budget", P.POSITIONAL_OR_KEYWORD, default=0)])
    calls: list = []
    ours = wrap_factory(upstream_like(sig, calls))
    assert "routing_budget" in inspect.signature(ours).parameters
    ours(top_k=2, global_num_experts=8, routing_budget=7, skip_padding=True)
    assert calls[-1]["routing_budget"] == 7 and "skip_padding" not in calls[-1]


def test_future_kwarg_removed_is_rejected_like_upstream(releases_dir):
    sig = _edit(_release_sig(releases_dir), drop=("hash_indices_table",))
    ours = wrap_factory(upstream_like(sig, []))
    assert "hash_indices_table" not in inspect.signature(ours).parameters
    with pytest.raises(TypeError):
        ours(top_k=2, global_num_experts=8, hash_indices_table=None)


def test_future_kwarg_renamed(releases_dir):
    sig = _edit(_release_sig(releases_dir), rename=("num_expert_group", "num_groups"))
    calls: list = []
    ours = wrap_factory(upstream_like(sig, calls))
    params = inspect.signature(ours).parameters
    assert "num_groups" in params and "num_expert_group" not in params
    ours(top_k=2, global_num_experts=8, num_groups=4)
    assert calls[-1]["num_groups"] == 4


def test_future_var_kwargs_pass_unknown_through(releases_dir):
    sig = _edit(_release_sig(releases_dir), add=[P("kwargs", P.VAR_KEYWORD)])
    calls: list = []
    ours = wrap_factory(upstream_like(sig, calls))
    ours_sig = inspect.signature(ours)
    names = list(ours_sig.parameters)
    assert names[-2:] == ["skip_padding", "kwargs"], "skip_padding goes before **kwargs"
    ours(top_k=2, global_num_experts=8, brand_new=1)
    assert calls[-1]["kwargs"] == {"brand_new": 1}


def test_keyword_only_upstream_gets_keyword_only_skip_padding():
    sig = inspect.Signature([P("top_k", P.POSITIONAL_OR_KEYWORD), P("x", P.KEYWORD_ONLY, default=1)])
    new = with_parameter(sig, "skip_padding", False, bool)
    assert new.parameters["skip_padding"].kind is P.KEYWORD_ONLY


def test_factory_moved_to_another_module_keeps_its_own_signature(releases_dir):
    """Moved factory (future): upstream cannot be recognised by module; the wrapped
    function's own signature (+ skip_padding) is used."""
    sig = _edit(_release_sig(releases_dir), add=[P("moved_extra", P.POSITIONAL_OR_KEYWORD, default=None)])
    moved = upstream_like(sig, [], module="vllm.model_executor.layers.fused_moe.routing.factory")
    ours = wrap_factory(moved)
    assert_parity(inspect.signature(ours), sig)


def test_factory_module_missing_gives_one_clear_error(monkeypatch, tmp_path):
    """A vLLM whose router_factory module is gone (FAKE vLLM package dir): the patch
    refuses with a message naming the module; the loader turns it into one warning."""
    from vllm_padplugin.patches import router_factory
    from vllm_padplugin.patches.base import Env

    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    fake = types.ModuleType("vllm")
    fake.__file__ = str(pkg / "__init__.py")
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.delitem(sys.modules, FACTORY_MODULE, raising=False)
    with pytest.raises(LookupError, match="router_factory not found in the installed vLLM 9.9.9"):
        router_factory.PATCH.apply(Env("9.9.9", "cuda", "backport", False))


@pytest.mark.vllm
def test_parity_with_installed_vllm(vllm):
    import importlib

    mod = importlib.import_module(FACTORY_MODULE)
    from vllm_padplugin.compat_utils import innermost

    upstream = innermost(getattr(mod, FACTORY_NAME))
    assert upstream.__module__ == FACTORY_MODULE
    ours = wrap_factory(upstream)
    assert_parity(inspect.signature(ours), inspect.signature(upstream))
    # and the release source read statically agrees with the imported function
    src = signature_from_source(inspect.getsourcefile(upstream), FACTORY_NAME)
    assert list(src.parameters) == list(inspect.signature(upstream).parameters)


# ------------------------------------------------------------ pure helpers behind the override


@pytest.mark.parametrize(
    "mode,requested,inner_masks,v2,env_on,grouped,expect",
    [
        ("backport", None, False, True, True, True, True),    # old layer, DeepEP v2: auto
        ("backport", True, False, True, True, True, True),
        ("backport", False, False, True, True, True, False),  # explicitly not requested
        ("backport", None, False, False, True, True, False),  # not DeepEP v2
        ("backport", None, False, True, False, True, False),  # VLLM_MOE_SKIP_PADDING=0
        ("backport", None, False, True, True, False, False),  # not a grouped router
        ("native", True, True, True, True, True, False),      # upstream masks: never twice
        ("native", True, False, True, True, True, True),      # foreign factory without skip_padding
        ("native", None, False, True, True, True, False),     # caller did not ask
        ("hpu-noop", True, False, True, True, True, False),
        ("passthrough", True, False, True, True, True, False),
    ],
)
def test_should_mask_table(mode, requested, inner_masks, v2, env_on, grouped, expect):
    from vllm_padplugin.router_override import should_mask

    assert should_mask(mode=mode, requested=requested, inner_masks=inner_masks, deepep_v2=v2,
                       env_on=env_on, grouped=grouped) is expect


def test_accepts_kwarg_follows_wrapped_only():
    import functools

    from vllm_padplugin.compat_utils import accepts_kwarg, has_argument

    def new(top_k, skip_padding=False): ...
    def old(top_k): ...

    @functools.wraps(new)
    def wraps_new(*a, **kw): ...

    @functools.wraps(old)
    def wraps_old(*a, **kw): ...

    def bare(*a, **kw): ...

    assert has_argument(new, "skip_padding") and not has_argument(old, "skip_padding")
    assert accepts_kwarg(new, "skip_padding") and not accepts_kwarg(old, "skip_padding")
    assert accepts_kwarg(wraps_new, "skip_padding") and not accepts_kwarg(wraps_old, "skip_padding")
    assert not accepts_kwarg(bare, "skip_padding"), "**kwargs alone proves nothing"


def test_signature_from_source_method_and_missing(releases_dir):
    path = releases_dir / "0.31.0" / "vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py"
    if not path.exists():
        pytest.skip(f"{path} absent")
    sig = signature_from_source(path, "GroupedTopKRouter.__init__")
    assert list(sig.parameters)[0] == "self" and sig.parameters["skip_padding"].default is False
    with pytest.raises(LookupError, match="NoSuchRouter"):
        signature_from_source(path, "NoSuchRouter.__init__")


@pytest.mark.parametrize("raw,expect", [(None, True), ("1", True), ("0", False), ("false", False),
                                        ("True", True), (" 0 ", False), ("2", True)])
def test_skip_padding_env_parsing(monkeypatch, raw, expect):
    from vllm_padplugin.routing import skip_padding_env_enabled

    if raw is None:
        monkeypatch.delenv("VLLM_MOE_SKIP_PADDING", raising=False)
    else:
        monkeypatch.setenv("VLLM_MOE_SKIP_PADDING", raw)
    assert skip_padding_env_enabled() is expect
