"""Pure signature model shared by the static check and the runtime shim."""
from vllm_padplugin.compat.sigdiff import (KEYWORD_ONLY, VAR_KEYWORD, Param, accepts, diff,
                                           drop_self)


def P(name, default=False, kind="POSITIONAL_OR_KEYWORD"):
    return Param(name, kind, default, "None" if default else None)


OLD = [P("top_k"), P("n"), P("renormalize", True), P("skip_padding", True)]


def test_no_change_is_empty():
    assert diff(OLD, list(OLD)).empty


def test_removed_renamed_required_added():
    new = [P("top_k"), P("n"), P("normalize", True), P("skip_padding"), P("extra", True)]
    d = diff(OLD, new)
    assert d.renamed == (("renormalize", "normalize"),)
    assert d.made_required == ("skip_padding",)
    assert d.added == ("extra",)
    assert d.breaking


def test_removed_without_rename_and_kwargs_absorb_removal():
    new = [P("top_k"), P("n"), P("skip_padding", True)]
    assert diff(OLD, new).removed == ("renormalize",)
    assert diff(OLD, new + [Param("kw", VAR_KEYWORD)]).removed == ()


def test_accepts_keyword_only_and_var_keyword():
    ps = [P("a"), Param("b", KEYWORD_ONLY, True, "1")]
    assert accepts(ps, "b") and not accepts(ps, "c")
    assert accepts(ps + [Param("kw", VAR_KEYWORD)], "c")
    assert drop_self([P("self")] + ps) == ps
