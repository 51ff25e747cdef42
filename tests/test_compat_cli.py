"""The real ``vllm-padplugin compat`` CLI as a subprocess: bad input gives one clear message,
exit 2 and no traceback; the installed vLLM is checked without importing it."""
from __future__ import annotations

import json
import subprocess

import pytest

from compat_helpers import FX, PLUGINS, cli, git, make_history, make_tree


def assert_input_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "Traceback" not in out, out
    for n in needles:
        assert n in out, out


def test_missing_path(tmp_path):
    assert_input_error(cli("compat", "--vllm-src", str(tmp_path / "nope")), "does not exist")


def test_not_a_vllm_tree(tmp_path):
    (tmp_path / "x.py").write_text("pass\n")
    assert_input_error(cli("compat", "--vllm-src", str(tmp_path)), "not a vLLM source tree")


def test_accepts_repo_root_or_package_dir():
    for path in (FX / "vllm_base", FX / "vllm_base" / "vllm"):
        p = cli("compat", "--vllm-src", str(path))
        assert p.returncode == 0 and "COMPATIBLE" in p.stdout, p.stdout + p.stderr


def test_syntax_error_in_upstream_file(tmp_path):
    p = cli("compat", "--vllm-src", str(make_tree(tmp_path, "syntax_error")))
    assert_input_error(p, "vllm/envs.py:5", "syntax error")


@pytest.fixture(scope="module")
def hist(tmp_path_factory):
    return make_history(tmp_path_factory.mktemp("h"), [("drift", ["env_default"]), ("later", [])])


def test_git_bad_revision(hist):
    repo, _ = hist
    assert_input_error(cli("compat", "--git", str(repo), "--good", "deadbeef", "--bad", "main"),
                       "good revision 'deadbeef' does not exist")


def test_git_not_a_repo(tmp_path):
    assert_input_error(cli("compat", "--git", str(tmp_path), "--good", "a", "--bad", "b"),
                       "not a git repository")


def test_git_needs_good_and_bad(hist):
    repo, _ = hist
    assert_input_error(cli("compat", "--git", str(repo), "--bad", "main"), "--good")


def test_git_shallow_clone_lacks_good(hist, tmp_path):
    repo, shas = hist
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True)
    assert git(shallow, "rev-parse", "--is-shallow-repository") == "true"
    assert_input_error(cli("compat", "--git", str(shallow), "--good", shas[0], "--bad", "HEAD"),
                       "shallow clone")


def test_git_good_not_ancestor(hist):
    repo, shas = hist
    assert_input_error(cli("compat", "--git", str(repo), "--good", shas[2], "--bad", shas[0]),
                       "not an ancestor")


def test_plugin_src_missing_and_broken(tmp_path):
    assert_input_error(cli("compat", "--vllm-src", str(FX / "vllm_base"), "--plugin-src", str(tmp_path / "no")),
                       "does not exist")
    (tmp_path / "bad.py").write_text("def f(:\n")
    assert_input_error(cli("compat", "--vllm-src", str(FX / "vllm_base"), "--plugin-src", str(tmp_path)),
                       "syntax error in plugin file")


def test_bad_format_is_usage_error():
    p = cli("compat", "--vllm-src", str(FX / "vllm_base"), "--format", "yaml")
    assert p.returncode == 2 and "Traceback" not in p.stdout + p.stderr


def test_exit_one_on_breaking_and_json_contract(tmp_path):
    p = cli("compat", "--vllm-src", str(FX / "vllm_base"), "--plugin-src", str(PLUGINS / "gaudi_like"),
            "--format", "json")
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert doc["compatible"] is False
    for f in doc["findings"]:
        assert {"kind", "symbol", "detail", "severity", "fix"} <= set(f)
        assert f["severity"] in ("breaking", "info")


@pytest.mark.vllm
def test_installed_vllm_checked_without_import(vllm):
    """Default target: the installed vLLM, located with find_spec (the child never imports vllm)."""
    from conftest import vllm_version_tuple

    probe = ("import sys, runpy; sys.argv=['vllm-padplugin','compat','--format','json'];"
             "import vllm_padplugin.cli as c\ntry:\n c.main()\nexcept SystemExit as e:\n"
             " assert 'vllm' not in sys.modules, 'vllm was imported'; sys.exit(e.code)")
    p = subprocess.run([__import__("sys").executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["vllm_version"].startswith(vllm.__version__.split("+")[0][:4])
    assert doc["mode"] == ("native" if vllm_version_tuple() >= (0, 31) else "backport")
    assert all(f["severity"] == "info" for f in doc["findings"])
