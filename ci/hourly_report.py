"""Markdown report of one hourly vLLM-main check (pure: a result dict in, text out).

Why separate: the same text goes to ``--report``, to GitHub's job summary and into
a fix PR, and it is the part people read, so its honesty rules live in one place:
the overall status is computed here from the steps, a skipped step is always shown
as skipped, and a run with a skipped required step is never called green.

Standard library only.
"""
from __future__ import annotations

STEP_ICONS = {"passed": "✅", "failed": "❌", "error": "⚠️", "skipped": "⏭️", "done": "🔎"}
STATUS_BADGES = {
    "green": "🟢 green",
    "red": "🔴 red",
    "incomplete": "⚪ incomplete (not green: a required step was skipped)",
    "skipped": "⏭️ skipped (nothing was checked in this run)",
}


def overall_status(steps: list[dict]) -> str:
    """red if any step failed or errored; green only if every required step ran and passed.

    A step dict has ``status`` (passed | failed | error | skipped | done) and
    ``required`` (bool).  "done" is the culprit search finishing its job (it only
    runs when the run is already red).  If no required step ran at all the run is
    "skipped"; if some ran and passed but another required one was skipped it is
    "incomplete".
    """
    if any(s["status"] in ("failed", "error") for s in steps):
        return "red"
    required = [s for s in steps if s.get("required")]
    if required and all(s["status"] == "passed" for s in required):
        return "green"
    if not any(s["status"] == "passed" for s in required):
        return "skipped"
    return "incomplete"


def _step_status(result: dict, name: str) -> str:
    return next((s["status"] for s in result.get("steps", []) if s.get("name") == name), "")


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "none"


def _commit(sha: str | None, url: str | None, subject: str = "") -> str:
    if not sha:
        return "none"
    text = f"[`{_short(sha)}`]({url}/commit/{sha})" if url else f"`{_short(sha)}`"
    return f"{text} {_escape(subject)}".strip()


def _escape(text: str) -> str:
    """Keep upstream commit subjects and details from breaking tables or injecting markup."""
    return (text or "").replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def render(result: dict) -> str:
    vllm = result.get("vllm", {})
    url = vllm.get("url")
    lg = result.get("last_good", {})
    compat = result.get("compat", {})
    lines = [f"# vLLM main hourly check: {STATUS_BADGES[result['status']]}", ""]
    if result.get("skip_reason"):
        lines += [f"> Not checked: {_escape(result['skip_reason'])}. The last completed run was "
                  f"**{result.get('previous_status') or 'unknown'}**; nothing in this run is evidence of green.", ""]
    lines += [
        "| | |",
        "|---|---|",
        f"| vLLM commit | {_commit(vllm.get('commit'), url, vllm.get('subject', ''))} |",
        f"| vLLM commit date | {_escape(vllm.get('date', ''))} |",
        *([f"| vLLM version (source) | {_escape(str(compat['vllm_version']))} |"] if compat.get("vllm_version") else []),
        *([f"| upstream masking | {_escape(str(compat['mode']))} |"] if compat.get("mode") else []),
        f"| plugin commit | `{_short(result.get('plugin_commit'))}` |",
        f"| last-good vLLM commit (before) | {_commit(lg.get('before'), url)} |",
        f"| last-good vLLM commit (after) | {_commit(lg.get('after'), url)}"
        f"{' (advanced)' if lg.get('advanced') else ' (unchanged)'} |",
        *([f"| culprit search range | {_commit(result['searched_from'], url)}..HEAD |"]
          if result.get("searched_from") else []),
        f"| checked at | {_escape(result.get('at', ''))} |",
        "",
    ]
    findings = result.get("findings", [])
    breaking = [f for f in findings if f.get("severity") == "breaking"]
    info = [f for f in findings if f.get("severity") != "breaking"]
    if breaking:
        lines += [f"## Breaking findings ({len(breaking)})", ""]
        for i, f in enumerate(breaking, 1):
            lines += [f"### {i}. `{_escape(f.get('symbol', '?'))}`: {_escape(f.get('kind', '?'))}", "",
                      _escape(f.get("detail", "")), ""]
            culprit = f.get("first_bad_commit")
            if culprit:
                lines.append(f"- **Culprit (first bad vLLM commit):** "
                             f"{_commit(culprit, url, f.get('culprit_subject', ''))} (`{culprit}`)")
            else:
                lines.append(f"- **Culprit:** not named ({_escape(f.get('culprit_note') or 'culprit search did not run')})")
            if f.get("fix"):
                lines.append(f"- **Suggested fix:** {_escape(f['fix'])}")
            lines.append("")
    elif _step_status(result, "static") == "passed":
        lines += ["## Breaking findings", "", "None: the plugin's upstream surface is intact at this commit.", ""]
    elif result["status"] != "skipped":
        lines += ["## Breaking findings", "", "Unknown: the static check did not complete (see its step below).", ""]
    moves = [f for f in info if f.get("kind") == "symbol-moved" and f.get("status") == "moved"]
    info = [f for f in info if f not in moves]
    if moves:
        lines += [f"## Moved upstream ({len(moves)}): followed, no action needed", "",
                  "The plugin found these where vLLM keeps them now (same kind, same parameters and members) "
                  "and patches them there; each is information, not a failure.", "",
                  "| moved from | now at | what | found via | first commit where it moved |",
                  "|---|---|---|---|---|"]
        for f in moves:
            when = (_commit(f["moved_in"], url, f.get("moved_subject", "")) if f.get("moved_in")
                    else _escape(f.get("moved_note") or "not searched"))
            lines.append(f"| `{_escape(f.get('moved_from') or f.get('symbol', '?'))}` | "
                         f"`{_escape(', '.join(f.get('moved_to') or []))}` | "
                         f"{_escape(', '.join(f.get('names') or []))} | {_escape(f.get('via', ''))} | {when} |")
        lines.append("")
    if info:
        lines += [f"<details><summary>Info findings ({len(info)}): no action needed</summary>", ""]
        lines += [f"- `{_escape(f.get('symbol', '?'))}` {_escape(f.get('kind', '?'))}: {_escape(f.get('detail', ''))}"
                  for f in info]
        lines += ["", "</details>", ""]
    if compat.get("errors"):
        lines += ["## Source files the static check could not read", "",
                  *[f"- {_escape(str(e))}" for e in compat["errors"]], ""]
    lines += ["## Steps", "", "| step | status | time | detail |", "|---|---|---|---|"]
    for s in result.get("steps", []):
        icon = STEP_ICONS.get(s["status"], "")
        req = f" ({s['when']})" if s.get("when") else ""
        lines.append(f"| {s['title']}{req} | {icon} {s['status']} | {s.get('seconds', 0):.1f} s | "
                     f"{_escape(s.get('detail', ''))} |")
    lines.append("")
    for s in result.get("steps", []):
        if s.get("log_tail") and s["status"] in ("failed", "error"):
            lines += [f"<details><summary>{_escape(s['title'])}: output (last lines)</summary>", "", "```",
                      s["log_tail"].replace("```", "'''"), "```", "", "</details>", ""]
    return "\n".join(lines)
