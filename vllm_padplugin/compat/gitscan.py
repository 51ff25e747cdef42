"""``--git``: name, for each finding, the first commit where it appears.

Never checks a commit out: each revision is a ``GitReader`` that reads only the files
the checks ask for through one long-lived ``git cat-file --batch`` and finds binding
sites with ``git grep REV``.  The range is ``git rev-list --first-parent good..bad``;
up to ``LINEAR_MAX`` commits are scanned one by one (exact even if a finding comes and
goes); longer ranges are bisected per finding (assumes it stays once it appears).
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..surface import SURFACE, Finding
from .checks import Baseline, check_surface
from .source import SourceError, Tree, read_version
from .view import StaticView

LINEAR_MAX = 64


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise SourceError(f"git {' '.join(args)} failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


class CatFile:
    """One ``git cat-file --batch`` process shared by every revision's reader."""

    def __init__(self, repo: Path):
        self.proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def get(self, spec: str) -> tuple[str, bytes] | None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(spec.encode() + b"\n")
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        if len(header) != 3:          # "<spec> missing" / "ambiguous"
            return None
        size = int(header[2])
        data = self.proc.stdout.read(size + 1)[:-1]
        return header[1].decode(), data

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


class GitReader:
    def __init__(self, repo: Path, rev: str, cat: CatFile, prefix: str = ""):
        self.repo, self.rev, self.cat, self.prefix = repo, rev, cat, prefix
        self._grep: dict[str, list[str]] = {}

    def read(self, relpath: str) -> str | None:
        got = self.cat.get(f"{self.rev}:{self.prefix}{relpath}")
        if got is None or got[0] != "blob":
            return None
        return got[1].decode("utf-8", errors="replace")

    def grep(self, word: str) -> list[str]:
        if word not in self._grep:
            self._grep[word] = self._git_grep(word)
        return self._grep[word]

    def _git_grep(self, word: str) -> list[str]:
        p = _git(self.repo, "grep", "-l", "-F", "-w", word, self.rev, "--", f"{self.prefix}vllm", check=False)
        out = []
        for line in p.stdout.splitlines():
            path = line.split(":", 1)[1] if ":" in line else line
            if path.endswith(".py"):
                out.append(path[len(self.prefix):])
        return out

    def label(self) -> str:
        return f"{self.repo}@{self.rev[:12]}"


def resolve_rev(repo: Path, rev: str, what: str) -> str:
    p = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if p.returncode != 0:
        shallow = _git(repo, "rev-parse", "--is-shallow-repository", check=False).stdout.strip() == "true"
        hint = (" This is a shallow clone: fetch more history (git fetch --unshallow, or --shallow-since) "
                "so the good revision is present." if shallow else "")
        raise SourceError(f"{what} revision {rev!r} does not exist in {repo}.{hint}")
    return p.stdout.strip()


def find_prefix(repo: Path, rev: str, cat: CatFile) -> str:
    """'' when vllm/ is at the repo root (the normal vLLM repo)."""
    for prefix in ("", "src/"):
        got = cat.get(f"{rev}:{prefix}vllm/__init__.py")
        if got is not None and got[0] == "blob":
            return prefix
    raise SourceError(f"{repo} at {rev[:12]} is not a vLLM tree (no vllm/__init__.py)")


@dataclass
class GitScan:
    good: str
    bad: str
    commits: list[str]                      # good..bad, oldest first
    findings: list[Finding]                 # at bad, each with first_bad_commit
    resolved: list[Finding] = field(default_factory=list)   # at good, gone by bad
    subjects: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    evaluated: int = 0
    bad_version: str | None = None          # vllm/_version.py at bad, when the tree has one


def ident(f: Finding) -> tuple:
    return (f.kind, f.symbol, str(f.extra.get("item", "")))


def final_run_start(seq: list[str], holds, linear: bool, floor: int) -> int:
    """Index in ``seq`` where the final run of commits on which ``holds`` is true begins.

    ``holds(seq[-1])`` is true.  Linear: walk back commit by commit (exact, never below
    ``floor``).  Otherwise bisect, assuming ``holds`` is false at ``seq[0]`` and flips once.
    """
    if linear:
        i = len(seq) - 1
        while i > floor and holds(seq[i - 1]):
            i -= 1
        return i
    lo, hi = 0, len(seq) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(seq[mid]):
            hi = mid
        else:
            lo = mid
    return hi


def scan(repo: str | Path, good: str, bad: str, surface=SURFACE, check=None,
         linear_max: int = LINEAR_MAX) -> GitScan:
    """Run ``check(view, baseline)`` (default: our registry) over good..bad."""
    repo = Path(repo).expanduser()
    if not repo.exists():
        raise SourceError(f"git repository path does not exist: {repo}")
    if _git(repo, "rev-parse", "--git-dir", check=False).returncode != 0:
        raise SourceError(f"not a git repository: {repo}")
    g, b = resolve_rev(repo, good, "good"), resolve_rev(repo, bad, "bad")
    if _git(repo, "merge-base", "--is-ancestor", g, b, check=False).returncode != 0:
        raise SourceError(f"good {good!r} is not an ancestor of bad {bad!r}")
    commits = _git(repo, "rev-list", "--first-parent", "--reverse", f"{g}..{b}").stdout.split()
    subjects = dict(line.split(" ", 1) for line in _git(
        repo, "log", "--first-parent", "--format=%H %s", f"{g}..{b}").stdout.splitlines()
        if " " in line)
    cat = CatFile(repo)
    try:
        prefix = find_prefix(repo, g, cat)
        cache: dict[str, dict[tuple, Finding]] = {}
        errors: list[str] = []
        base_view = StaticView(Tree(GitReader(repo, g, cat, prefix)))
        baseline = Baseline.of(base_view, surface)
        run = check or (lambda view, bl: check_surface(view, surface, bl))

        last: dict = {}   # the relocations of the last commit checked: hints for the next one

        def at(rev: str) -> dict[tuple, Finding]:
            if rev not in cache:
                view = base_view if rev == g else StaticView(Tree(GitReader(repo, rev, cat, prefix)))
                # good and bad are always resolved from scratch (ambiguity checked there)
                view.prior_relocations = dict(last) if rev not in (g, b) else {}
                found = run(view, baseline)
                last.clear()
                last.update(view.__dict__.get("_relocations", {}))
                errors.extend(f"{rev[:12]}: {e}" for e in view.tree.errors)
                cache[rev] = {ident(f): f for f in found}
            return cache[rev]

        at_good, at_bad = at(g), at(b)
        seq = [g] + commits
        linear = len(commits) <= linear_max   # exact scan; bisect beyond
        out = []
        for fid, f in at_bad.items():
            if fid in at_good and all(fid in at(c) for c in (commits if linear else [])):
                f.first_bad_commit = g
                f.extra["before_good"] = True
            else:
                f.first_bad_commit = seq[final_run_start(
                    seq, lambda c, fid=fid: fid in at(c), linear, floor=0)]
            if f.first_bad_commit in subjects:
                f.extra["commit_subject"] = subjects[f.first_bad_commit]
            out.append(f)
        resolved = []
        for fid, f in at_good.items():
            if fid in at_bad:
                continue
            f.extra["resolved_in"] = seq[final_run_start(
                seq, lambda c, fid=fid: fid not in at(c), linear, floor=1)]
            resolved.append(f)
        version = read_version(Tree(GitReader(repo, b, cat, prefix)))
        return GitScan(g, b, commits, out, resolved, subjects, sorted(set(errors)), len(cache), version)
    finally:
        cat.close()
