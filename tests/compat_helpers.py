"""Helpers for the compat tests: fake vLLM trees from the base fixture + a drift overlay,
small git histories built with real git, and the real CLI run as a subprocess."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

FX = Path(__file__).resolve().parent / "fixtures" / "compat"
REPO = FX.parents[2]
PLUGINS = FX / "plugins"


def apply_overlay(dst: Path, name: str) -> None:
    """Copy drift/<name>'s files over ``dst`` (a file holding ``#DELETE`` deletes)."""
    src = FX / "drift" / name
    assert src.is_dir(), src
    for f in src.rglob("*"):
        if f.is_file():
            t = dst / f.relative_to(src)
            if f.read_text().strip() == "#DELETE":
                t.unlink()
            else:
                t.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, t)


def make_tree(tmp: Path, *overlays: str) -> Path:
    dst = tmp / ("tree-" + "-".join(overlays or ("base",)))
    shutil.copytree(FX / "vllm_base", dst)
    for o in overlays:
        apply_overlay(dst, o)
    return dst


GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def make_history(tmp: Path, steps: list[tuple[str, list[str]]]) -> tuple[Path, list[str]]:
    """A git repo: first commit = vllm_base, then one commit per (message, overlays) step."""
    repo = tmp / "vllm-repo"
    shutil.copytree(FX / "vllm_base", repo)
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    shas = [git(repo, "rev-parse", "HEAD")]
    for msg, overlays in steps:
        for o in overlays:
            apply_overlay(repo, o)
        if not overlays:
            (repo / "UNRELATED.md").write_text(msg + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", msg)
        shas.append(git(repo, "rev-parse", "HEAD"))
    return repo, shas


def cli(*args: str, python: str | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """The real ``vllm-padplugin`` CLI in a subprocess."""
    return subprocess.run([python or sys.executable, "-m", "vllm_padplugin.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=str(REPO))


def cli_json(*args: str, **kw) -> tuple[int, dict]:
    p = cli(*args, "--format", "json", **kw)
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    try:
        return p.returncode, json.loads(p.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON (rc={p.returncode}): {p.stdout[:500]} {p.stderr[:500]}") from None


def kinds(doc_or_findings) -> set[tuple[str, str]]:
    fs = doc_or_findings["findings"] if isinstance(doc_or_findings, dict) else doc_or_findings
    return {(f["kind"] if isinstance(f, dict) else f.kind, f["severity"] if isinstance(f, dict) else f.severity)
            for f in fs}
