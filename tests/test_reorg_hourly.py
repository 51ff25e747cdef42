"""ci/hourly when vLLM main MOVES a module the plugin uses (issue 12): green, with a note.

Real git (tests/fake_vllm_repo.py's small fake vLLM), the real ``compat`` command and
``ci/hourly`` as a subprocess.  A commit that moves ``vllm/forward_context.py`` to
``vllm/runtime/execution/forward_context.py`` (as vLLM main does) keeps the run green:
the static step passes, the range search names the commit where the move happened, the
report has a "Moved upstream" table, and last-good advances.
"""
from __future__ import annotations

from fake_vllm_repo import FakeVllmRepo
from test_ci_hourly import assert_runtime_shown_skipped, hourly, last_good


def test_move_is_green_with_the_commit_that_moved_it(tmp_path):
    vllm = FakeVllmRepo(tmp_path / "vllm")
    state = tmp_path / "state"
    c0 = vllm.clean()
    assert hourly(vllm.path, state, tmp_path / "r0").rc == 0 and last_good(state) == c0
    vllm.unrelated(1)
    subject = "[Refactor] Move forward_context into vllm.runtime.execution"
    c2 = vllm.move("vllm/forward_context.py", "vllm/runtime/execution/forward_context.py", subject)
    c3 = vllm.unrelated(2)

    run = hourly(vllm.path, state, tmp_path / "r1")
    assert run.rc == 0, run.stderr
    assert run.result["status"] == "incomplete" and run.step("static")["status"] == "passed"
    assert not run.breaking()
    (mv,) = [f for f in run.result["findings"] if f.get("status") == "moved"]
    assert mv["severity"] == "info" and mv["moved_from"] == "vllm.forward_context"
    assert mv["moved_to"] == ["vllm.runtime.execution.forward_context"] and mv["moved_in"] == c2
    assert run.step("culprit")["status"] == "done" and "first commit named for 1 of 1 move" in run.step("culprit")["detail"]
    assert "## Moved upstream (1)" in run.report and c2[:12] in run.report and subject in run.report
    assert "| `vllm.forward_context` | `vllm.runtime.execution.forward_context` |" in run.report
    assert "Breaking findings" in run.report and "None: the plugin's upstream surface is intact" in run.report
    assert last_good(state) == c3                         # a move does not hold last-good back
    assert_runtime_shown_skipped(run)

    # next hour: the move is older than last-good: still listed, no commit search result needed
    c4 = vllm.unrelated(3)
    again = hourly(vllm.path, state, tmp_path / "r2")
    assert again.rc == 0 and last_good(state) == c4
    (mv,) = [f for f in again.result["findings"] if f.get("status") == "moved"]
    assert mv.get("moved_note") == "already moved at the last-good commit"
    assert "## Moved upstream (1)" in again.report


def test_compat_git_names_the_commit_where_it_moved(tmp_path):
    """``compat --git good..bad``: the move's finding carries the first commit where it moved."""
    import json

    from vllm_padplugin.cli.compat import run_compat

    vllm = FakeVllmRepo(tmp_path / "vllm")
    c0 = vllm.clean()
    vllm.unrelated(1)
    c2 = vllm.move("vllm/forward_context.py", "vllm/runtime/execution/forward_context.py", "[Refactor] move")
    c3 = vllm.unrelated(2)
    out, code = run_compat(git=vllm.path, good=c0, bad=c3, fmt="json")
    doc = json.loads(out)
    assert code == 0 and doc["breaking"] == 0
    (mv,) = [f for f in doc["findings"] if f.get("status") == "moved"]
    assert mv["first_bad_commit"] == c2 and mv["commit_subject"] == "[Refactor] move"
    text, _ = run_compat(git=vllm.path, good=c0, bad=c3, fmt="text")
    assert f"moved in commit: {c2}" in text and "symbol-moved: vllm.forward_context" in text


def test_compat_git_still_sees_an_ambiguity_at_bad(tmp_path):
    """Intermediate commits reuse a neighbour's verified home (speed); --bad is resolved from
    scratch, so a second candidate appearing there is still a red symbol-ambiguous."""
    import json

    from vllm_padplugin.cli.compat import run_compat

    vllm = FakeVllmRepo(tmp_path / "vllm")
    c0 = vllm.clean()
    vllm.move("vllm/forward_context.py", "vllm/runtime/execution/forward_context.py", "[Refactor] move")
    vllm.unrelated(1)
    text = (vllm.path / "vllm/runtime/execution/forward_context.py").read_text()
    vllm.write("vllm/runtime/legacy/__init__.py", "")
    vllm.write("vllm/runtime/legacy/forward_context.py", text)
    c3 = vllm.commit("[Misc] add a copy of the forward context")
    out, code = run_compat(git=vllm.path, good=c0, bad=c3, fmt="json")
    doc = json.loads(out)
    assert code == 1
    amb = [f for f in doc["findings"] if f["kind"] == "symbol-ambiguous"]
    assert amb and all(f["first_bad_commit"] == c3 for f in amb)
    assert all(f["candidates"] == ["vllm.runtime.execution.forward_context", "vllm.runtime.legacy.forward_context"]
               for f in amb)
