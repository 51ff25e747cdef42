"""Build a local git repository with one commit per extracted vLLM release (for ``--git`` tests
and the benchmark).  Each commit holds that release's full Python tree (``vllm/``), added
straight from the extracted folder (``git --work-tree``), so nothing is copied.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

RELEASES = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")


def releases_dir() -> Path:
    return Path(os.environ.get("PADPLUGIN_RELEASES_DIR", "/root/.cache/vllm_padplugin/releases"))


def build(dest: Path, versions=RELEASES, src: Path | None = None) -> dict[str, str]:
    """Create (or reuse, if complete) ``dest`` with tags v<ver>; returns {version: sha}."""
    src = src or releases_dir()
    dest = Path(dest)
    env = {**os.environ, "GIT_AUTHOR_NAME": "release-bot", "GIT_AUTHOR_EMAIL": "bot@example.invalid",
           "GIT_COMMITTER_NAME": "release-bot", "GIT_COMMITTER_EMAIL": "bot@example.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}

    def git(*a, cwd_tree=None):
        cmd = ["git", "--git-dir", str(dest / ".git")]
        if cwd_tree:
            cmd += ["--work-tree", str(cwd_tree)]
        return subprocess.run(cmd + list(a), check=True, capture_output=True, text=True, env=env).stdout

    done = dest / ".git" / "padplugin-complete"
    if done.exists() and done.read_text().split() == list(versions):
        return {v: git("rev-parse", f"v{v}^{{commit}}").strip() for v in versions}
    if dest.exists():
        subprocess.run(["rm", "-rf", str(dest)], check=True)
    dest.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(dest)], check=True, env=env)
    out = {}
    for v in versions:
        tree = src / v
        if not (tree / "vllm" / "__init__.py").is_file():
            raise FileNotFoundError(f"release sources missing: {tree}/vllm")
        git("add", "-A", ".", cwd_tree=tree)
        git("commit", "-q", "-m", f"vLLM {v}", cwd_tree=tree)
        git("tag", f"v{v}")
        out[v] = git("rev-parse", "HEAD").strip()
    done.write_text("\n".join(versions))
    return out
