"""``compat --git``: the first bad commit per finding, with real git repositories.

1. A small history built from the fake vLLM fixture (base, a drift commit, unrelated commits).
2. The acceptance run: one commit per official vLLM release 0.28 -> 0.34 (full Python trees of
   the extracted releases, committed with ``git --work-tree``), checked for the release that
   introduced each change of the plugin's surface.
"""
from __future__ import annotations

import pytest

from compat_helpers import PLUGINS, cli_json, git, make_history
from vllm_padplugin.compat import gitscan
from vllm_padplugin.compat.release_repo import RELEASES, build


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    return make_history(tmp_path_factory.mktemp("hist"), [
        ("unrelated docs", []),
        ("envs: flip MoE padding default; ubatch: simplify contexts", ["env_default", "propagation_lost"]),
        ("unrelated 2", []),
        ("forward_context: rename is_padding to padding_mask", ["param_removed"]),
        ("unrelated 3", []),
    ])


def by(doc, kind, suffix=""):
    return [f for f in doc["findings"] if f["kind"] == kind and f["symbol"].endswith(suffix)]


def test_first_bad_commit_per_finding(history):
    repo, shas = history
    code, doc = cli_json("compat", "--git", str(repo), "--good", shas[0], "--bad", "main")
    assert code == 1 and doc["compatible"] is False
    assert by(doc, "env-default-changed")[0]["first_bad_commit"] == shas[2]
    assert by(doc, "propagation-lost", "_make_forward_contexts")[0]["first_bad_commit"] == shas[2]
    renamed = by(doc, "param-renamed", "create_forward_context")
    assert renamed and renamed[0]["item"] == "is_padding->padding_mask" and renamed[0]["severity"] == "breaking"
    assert renamed[0]["first_bad_commit"] == shas[4]
    assert all(len(f["first_bad_commit"]) == 40 for f in doc["findings"])
    assert doc["commits_in_range"] == 5


def test_bisect_agrees_with_linear_scan(history):
    repo, shas = history
    lin = gitscan.scan(repo, shas[0], shas[-1])
    bis = gitscan.scan(repo, shas[0], shas[-1], linear_max=1)
    assert {gitscan.ident(f): f.first_bad_commit for f in lin.findings} == \
        {gitscan.ident(f): f.first_bad_commit for f in bis.findings}
    assert bis.evaluated <= len(shas)


def test_bisect_agrees_on_releases(release_repo):
    repo, _ = release_repo
    lin = gitscan.scan(repo, "v0.28.0", "v0.34.0")
    bis = gitscan.scan(repo, "v0.28.0", "v0.34.0", linear_max=1)
    for attr, field in (("findings", None), ("resolved", "resolved_in")):
        pick = (lambda f: f.first_bad_commit) if field is None else (lambda f: f.extra[field])
        assert {gitscan.ident(f): pick(f) for f in getattr(lin, attr)} == \
            {gitscan.ident(f): pick(f) for f in getattr(bis, attr)}


def test_clean_range_is_compatible(history):
    repo, shas = history
    code, doc = cli_json("compat", "--git", str(repo), "--good", shas[0], "--bad", shas[1])
    assert (code, doc["findings"]) == (0, [])


def test_markdown_names_culprit(history):
    from compat_helpers import cli

    repo, shas = history
    p = cli("compat", "--git", str(repo), "--good", shas[0], "--bad", "main", "--format", "md")
    assert p.returncode == 1
    assert f"**Culprit commit:** `{shas[2]}` (envs: flip MoE padding default" in p.stdout


# -- official releases -------------------------------------------------------

@pytest.fixture(scope="module")
def release_repo(releases_dir, tmp_path_factory):
    dest = tmp_path_factory.mktemp("releases") / "vllm"
    shas = build(dest, RELEASES, releases_dir)
    return dest, shas


def test_git_over_releases_names_each_release(release_repo):
    repo, sha = release_repo
    code, doc = cli_json("compat", "--git", str(repo), "--good", "v0.28.0", "--bad", "v0.34.0")
    assert code == 0, doc       # every change is one our plugin handles
    first = {(f["kind"], f["key"], f.get("item")): f["first_bad_commit"] for f in doc["findings"]}
    assert first[("param-added", "router_factory", "skip_padding")] == sha["0.31.0"]
    assert first[("param-added", "grouped_topk_router", "skip_padding")] == sha["0.31.0"]
    assert first[("new-binding-site", "router_factory_binding_sites", "vllm.models.step5.nvidia.mega_moe")] \
        == sha["0.33.0"]
    assert first[("symbol-moved", "legacy_runner", None)] == sha["0.34.0"]
    assert first[("symbol-moved", "dbo_mask_propagation_legacy", None)] == sha["0.34.0"]
    resolved = {(f["kind"], f["key"]): f["resolved_in"] for f in doc["resolved"]}
    assert resolved[("propagation-lost", "dbo_mask_propagation_legacy")] == sha["0.31.0"]
    assert resolved[("symbol-removed", "dbo_mask_propagation_v2")] == sha["0.30.0"]
    assert all(f["severity"] == "info" for f in doc["findings"])


def test_git_other_plugin_gaudi_typeerror_culprit(release_repo):
    """A plugin that copied the factory without skip_padding breaks at 0.31 (layer.py passes it)."""
    repo, sha = release_repo
    code, doc = cli_json("compat", "--git", str(repo), "--good", "v0.30.0", "--bad", "v0.32.0",
                         "--plugin-src", str(PLUGINS / "gaudi_like"))
    assert code == 1
    hit = [f for f in doc["findings"] if f["kind"] == "override-missing-param" and f["item"] == "skip_padding"]
    assert hit and hit[0]["first_bad_commit"] == sha["0.31.0"]
    assert hit[0]["caller"] == "vllm.model_executor.layers.fused_moe.layer"


def test_release_repo_has_one_commit_per_release(release_repo):
    repo, sha = release_repo
    assert git(repo, "rev-list", "--count", "HEAD") == str(len(RELEASES))
