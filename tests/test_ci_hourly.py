"""ci/hourly, the hourly vLLM-main check, run for real against a local stand-in for vLLM.

Real git repositories (tests/fake_vllm_repo.py writes a small fake vLLM tree of its own,
then commits that break the plugin's surface the way upstream commits could), the real
``vllm-padplugin compat`` command, and ``ci/hourly`` as a subprocess, exactly as the
workflow runs it.  No mocks.  The runtime-test step (a vLLM CPU venv, minutes) is turned
off with ``--no-runtime-tests`` here, and every test that does so checks the report
shows it as skipped and never as green; one test runs the step for real with a python
that cannot run the suite, to show a failing runtime step makes the run red.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from fake_vllm_repo import BREAK_DBO, BREAK_FACTORY, FakeVllmRepo

REPO = Path(__file__).resolve().parent.parent
HOURLY = REPO / "ci" / "hourly"
FACTORY = "vllm.model_executor.layers.fused_moe.router.router_factory.create_fused_moe_router"
DBO = "vllm.v1.worker.gpu.ubatch_utils.UBatchRunner._make_forward_contexts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "ci" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod          # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


hourly_state = _load("hourly_state")
hourly_report = _load("hourly_report")


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, out: Path):
        self.rc, self.stderr = proc.returncode, proc.stderr
        self.report = (out / "report.md").read_text() if (out / "report.md").exists() else ""
        self.result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}

    def step(self, name: str) -> dict:
        return next(s for s in self.result["steps"] if s["name"] == name)

    def breaking(self) -> dict[tuple[str, str], dict]:
        return {(f["kind"], f["symbol"]): f for f in self.result["findings"] if f["severity"] == "breaking"}


def hourly(vllm: Path, state: Path, out: Path, *extra: str, runtime: bool = False, env=None) -> Run:
    out.mkdir(parents=True, exist_ok=True)
    for f in ("report.md", "result.json"):
        (out / f).unlink(missing_ok=True)
    cmd = [sys.executable, str(HOURLY), "--vllm-repo", str(vllm), "--state-dir", str(state),
           "--report", str(out / "report.md"), "--json", str(out / "result.json"), *extra]
    if not runtime:
        cmd.append("--no-runtime-tests")
    base = {k: v for k, v in __import__("os").environ.items() if not k.startswith("GITHUB_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**base, **(env or {})}, timeout=300)
    return Run(proc, out)


def last_good(state: Path) -> str | None:
    p = state / "VLLM_LAST_GOOD_COMMIT"
    return p.read_text().strip() if p.exists() else None


def assert_runtime_shown_skipped(run: Run) -> None:
    assert run.step("runtime")["status"] == "skipped"
    assert "| c. runtime tests" in run.report and "⏭️ skipped" in run.report
    assert "🟢" not in run.report and run.result["status"] != "green"


def test_breaking_commit_goes_red_names_culprits_and_keeps_last_good(tmp_path):
    vllm = FakeVllmRepo(tmp_path / "vllm")
    state = tmp_path / "state"
    c0 = vllm.clean()

    first = hourly(vllm.path, state, tmp_path / "r0")
    assert first.rc == 0, first.stderr
    assert last_good(state) == c0
    assert first.result["status"] == "incomplete"          # static passed, runtime skipped: not green
    assert_runtime_shown_skipped(first)

    vllm.unrelated(1)
    c2 = vllm.apply(BREAK_FACTORY)
    c3 = vllm.unrelated(2)
    c4 = vllm.apply(BREAK_DBO)
    c5 = vllm.unrelated(3)

    red = hourly(vllm.path, state, tmp_path / "r1")
    assert red.rc == 1, red.stderr
    assert red.result["status"] == "red" and "🔴 red" in red.report
    assert red.step("static")["status"] == "failed"
    assert red.step("culprit")["status"] == "done"
    found = red.breaking()
    assert found[("param-removed", FACTORY)]["first_bad_commit"] == c2
    assert found[("propagation-lost", DBO)]["first_bad_commit"] == c4
    # the culprits, by full sha, with their subject and a suggested fix, in the Markdown
    assert c2 in red.report and c4 in red.report
    assert BREAK_FACTORY[3] in red.report and BREAK_DBO[3] in red.report
    assert red.report.count("**Suggested fix:**") >= 2
    for innocent in (c3, c5):
        assert innocent not in red.report
    assert red.result["vllm"]["commit"] == c5 and c5[:12] in red.report
    assert last_good(state) == c0                          # not advanced
    assert red.step("record")["status"] == "skipped"
    assert_runtime_shown_skipped(red)
    assert hourly_state.read_state(state).consecutive_red == 1

    c6 = vllm.restore("Restore the router factory signature and DBO mask propagation")
    fixed = hourly(vllm.path, state, tmp_path / "r2")
    assert fixed.rc == 0, fixed.stderr
    assert fixed.result["findings"] and not fixed.breaking()
    assert last_good(state) == c6 and fixed.result["last_good"]["advanced"]
    assert hourly_state.read_state(state).consecutive_red == 0
    assert_runtime_shown_skipped(fixed)


def test_clean_history_advances_last_good(tmp_path):
    vllm = FakeVllmRepo(tmp_path / "vllm")
    state = tmp_path / "state"
    c0 = vllm.clean()
    assert hourly(vllm.path, state, tmp_path / "r0").rc == 0
    assert last_good(state) == c0
    c1 = vllm.unrelated(1)
    run = hourly(vllm.path, state, tmp_path / "r1")
    assert run.rc == 0, run.stderr
    assert last_good(state) == c1
    assert run.result["last_good"] == {"before": c0, "after": c1, "advanced": True}
    assert run.step("culprit")["status"] == "skipped"
    assert_runtime_shown_skipped(run)


def test_no_last_good_says_so(tmp_path):
    vllm = FakeVllmRepo(tmp_path / "vllm")
    vllm.clean()
    vllm.apply(BREAK_FACTORY)
    run = hourly(vllm.path, tmp_path / "state", tmp_path / "r")
    assert run.rc == 1
    assert run.step("culprit")["status"] == "skipped"
    assert "no last-good" in run.report
    assert last_good(tmp_path / "state") is None


def test_shallow_clone_fetches_history_back_to_last_good(tmp_path):
    """The workflow's setup: a --depth 1 clone of main; --fetch-history deepens it from origin."""
    origin = FakeVllmRepo(tmp_path / "origin")
    state = tmp_path / "state"
    c0 = origin.clean()
    hourly_state.write_last_good(state, c0)
    origin.unrelated(1)
    c2 = origin.apply(BREAK_FACTORY)
    origin.unrelated(2)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth=1", f"file://{origin.path}", str(clone)], check=True)

    blind = hourly(clone, state, tmp_path / "r0")
    assert blind.rc == 1 and blind.step("culprit")["status"] == "error"
    assert "not in the checkout" in blind.step("culprit")["detail"]

    run = hourly(clone, state, tmp_path / "r1", "--fetch-history")
    assert run.rc == 1, run.stderr
    assert run.breaking()[("param-removed", FACTORY)]["first_bad_commit"] == c2
    assert "deepened shallow clone" in run.step("culprit")["detail"]
    assert last_good(state) == c0


def test_backoff_while_red_skips_without_claiming_green(tmp_path):
    vllm = FakeVllmRepo(tmp_path / "vllm")
    state = tmp_path / "state"
    c0 = vllm.clean()
    hourly_state.write_last_good(state, c0)
    vllm.apply(BREAK_FACTORY)
    t0 = hourly_state.parse_time("2026-12-02T10:00:00+00:00")
    plugin = ["--plugin-commit", "1" * 40]        # the shared checkout's HEAD may move meanwhile
    at = lambda d: ["--cadence", "--now", (t0 + d).isoformat(), *plugin]  # noqa: E731

    assert hourly(vllm.path, state, tmp_path / "r0", *at(timedelta(0))).rc == 1
    assert hourly(vllm.path, state, tmp_path / "r1", *at(timedelta(hours=1))).rc == 1   # 1 h after 1 red
    before = (state / "hourly_state.json").read_text()
    skipped = hourly(vllm.path, state, tmp_path / "r2", *at(timedelta(hours=2)))     # 2 red: wait 2 h
    assert skipped.rc == 0
    assert skipped.result["status"] == "skipped"
    assert "skipped" in skipped.report.splitlines()[0] and "🟢" not in skipped.report
    assert "**red**" in skipped.report and "back-off" in skipped.report
    assert all(s["status"] == "skipped" for s in skipped.result["steps"])
    assert (state / "hourly_state.json").read_text() == before and last_good(state) == c0
    again = hourly(vllm.path, state, tmp_path / "r3", *at(timedelta(hours=3)))
    assert again.rc == 1 and hourly_state.read_state(state).consecutive_red == 3
    # without --cadence (manual dispatch) it always runs
    assert hourly(vllm.path, state, tmp_path / "r4", "--now", (t0 + timedelta(hours=3, minutes=5)).isoformat(),
                  *plugin).rc == 1
    # a new plugin commit (maybe the fix) runs despite the back-off
    assert hourly(vllm.path, state, tmp_path / "r5", *at(timedelta(hours=3, minutes=10))).result["status"] == "skipped"
    fix = hourly(vllm.path, state, tmp_path / "r6", "--cadence", "--now",
                 (t0 + timedelta(hours=3, minutes=15)).isoformat(), "--plugin-commit", "2" * 40)
    assert fix.rc == 1 and fix.step("static")["status"] == "failed"


def test_failing_runtime_step_is_red_and_keeps_last_good(tmp_path):
    """Step c for real, with a python that cannot run the suite (a bare venv without pytest)."""
    vllm = FakeVllmRepo(tmp_path / "vllm")
    state = tmp_path / "state"
    vllm.clean()
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    run = hourly(vllm.path, state, tmp_path / "r", "--python", str(bare / "bin" / "python"), runtime=True)
    assert run.rc == 1
    assert run.step("static")["status"] == "passed"
    assert run.step("runtime")["status"] == "failed"
    assert "No module named pytest" in run.report                 # its output tail is in the report
    assert last_good(state) is None


def test_github_summary_and_outputs(tmp_path):
    vllm = FakeVllmRepo(tmp_path / "vllm")
    c0 = vllm.clean()
    summary, outputs = tmp_path / "summary.md", tmp_path / "outputs"
    summary.write_text("earlier step\n")
    run = hourly(vllm.path, tmp_path / "state", tmp_path / "r",
                 env={"GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(outputs)})
    assert run.rc == 0
    text = summary.read_text()
    assert text.startswith("earlier step\n") and run.report in text
    out = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    assert out == {"status": "incomplete", "vllm_commit": c0, "state_written": "true"}


@pytest.mark.parametrize("make", ["not-git", "no-commit", "bad-state", "bad-good"])
def test_bad_input_exits_2_with_one_message(tmp_path, make):
    vllm = FakeVllmRepo(tmp_path / "vllm")
    vllm.clean()
    state, target, extra = tmp_path / "state", vllm.path, []
    if make == "not-git":
        target = tmp_path / "nothing-here"
        target.mkdir()
    elif make == "no-commit":
        target = FakeVllmRepo(tmp_path / "empty").path
    elif make == "bad-state":
        state.mkdir()
        (state / "VLLM_LAST_GOOD_COMMIT").write_text("main\n")
    else:
        extra = ["--good", "no-such-rev"]
    run = hourly(target, state, tmp_path / "r", *extra)
    assert run.rc == 2
    assert run.stderr.strip().startswith("ci/hourly:") and "Traceback" not in run.stderr


def test_overall_status_rules():
    def st(*pairs):
        return [{"status": s, "required": r} for s, r in pairs]

    assert hourly_report.overall_status(st(("passed", True), ("passed", True))) == "green"
    assert hourly_report.overall_status(st(("passed", True), ("skipped", True))) == "incomplete"
    assert hourly_report.overall_status(st(("skipped", True), ("skipped", True))) == "skipped"
    assert hourly_report.overall_status(st(("failed", True), ("passed", True))) == "red"
    assert hourly_report.overall_status(st(("passed", True), ("passed", True), ("error", False))) == "red"
    assert [hourly_state.backoff(n).total_seconds() / 3600 for n in range(7)] == [0, 1, 2, 4, 8, 16, 24]


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {**__import__("os").environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout


def test_push_state_keeps_the_branch_and_only_fast_forwards(tmp_path):
    """ci/push_state (the workflow's only write step) against a local bare remote."""
    remote, branch = tmp_path / "remote.git", "ci/vllm-last-good"
    _git("init", "-q", "--bare", str(remote))
    vllm = FakeVllmRepo(tmp_path / "vllm")
    c0 = vllm.clean()
    state = tmp_path / "state"
    assert hourly(vllm.path, state, tmp_path / "r0").rc == 0

    def push(msg: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(REPO / "ci" / "push_state"), str(state), str(remote), branch, msg],
                              capture_output=True, text=True)

    first = push("hourly: incomplete")
    assert first.returncode == 0, first.stderr
    assert _git("--git-dir", str(remote), "show", f"{branch}:VLLM_LAST_GOOD_COMMIT").strip() == c0
    # someone adds a README to the branch; later pushes keep it
    other = tmp_path / "other"
    _git("clone", "-q", "--branch", branch, str(remote), str(other))
    (other / "README.md").write_text("state of the hourly check\n")
    _git("add", "README.md", cwd=other)
    _git("commit", "-qm", "readme", cwd=other)
    _git("push", "-q", "origin", f"HEAD:{branch}", cwd=other)

    assert "unchanged" in push("hourly: no change").stdout
    c1 = vllm.unrelated(1)
    assert hourly(vllm.path, state, tmp_path / "r1").rc == 0
    second = push("hourly: advanced")
    assert second.returncode == 0, second.stderr
    files = set(_git("--git-dir", str(remote), "ls-tree", "--name-only", branch).split())
    assert files == {"README.md", "VLLM_LAST_GOOD_COMMIT", "hourly_state.json"}
    assert _git("--git-dir", str(remote), "show", f"{branch}:VLLM_LAST_GOOD_COMMIT").strip() == c1
    subjects = _git("--git-dir", str(remote), "log", "--format=%s", branch).split("\n")[:3]
    assert subjects == ["hourly: advanced", "readme", "hourly: incomplete"]


def test_static_check_error_is_red_and_claims_nothing(tmp_path):
    """A checkout that is not a vLLM tree: compat exits 2; the run is red, nothing is called intact."""
    other = FakeVllmRepo(tmp_path / "not-vllm")
    other.write("README.md", "some other project\n")
    other.commit("Not vLLM")
    run = hourly(other.path, tmp_path / "state", tmp_path / "r")
    assert run.rc == 1
    assert run.step("static")["status"] == "error" and "exited 2" in run.step("static")["detail"]
    assert "intact" not in run.report and "did not complete" in run.report
    assert last_good(tmp_path / "state") is None
