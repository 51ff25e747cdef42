"""State of the hourly vLLM-main check: the last-good vLLM commit and the cadence.

Why a directory of plain files: on a laptop it is any folder (``--state-dir``); on
GitHub the workflow keeps the same files on a dedicated branch (as vllm-gaudi keeps
its last-good commit) and pushes them after the run, so the script never needs a
token.  Two files:

- ``VLLM_LAST_GOOD_COMMIT``: the full sha of the newest vLLM commit the plugin was
  known to work with; the lower bound of the culprit search.  Written only when
  every step that ran passed and the static check did run.
- ``hourly_state.json``: the last run's status and how many runs in a row were red,
  for the back-off (one run per 1, 2, 4 ... 24 hours while red, like vllm-gaudi's
  24 h, but without waiting a whole day after the first red run).

Standard library only.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

LAST_GOOD_FILE = "VLLM_LAST_GOOD_COMMIT"
STATE_FILE = "hourly_state.json"
MAX_BACKOFF_HOURS = 24
# The hourly schedule fires with jitter: a run 55 minutes after the last one still counts as "an hour later".
SLACK = timedelta(minutes=10)
_SHA = re.compile(r"^[0-9a-f]{40}$")


class StateError(ValueError):
    """A state file exists but cannot be trusted (named in the message)."""


@dataclass
class RunState:
    status: str = ""             # red | green | incomplete (never "skipped": a skip changes nothing)
    at: str = ""                 # ISO time of the last completed run
    vllm_commit: str = ""
    plugin_commit: str = ""
    consecutive_red: int = 0
    red_since: str = ""


def now_utc() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def parse_time(text: str) -> datetime:
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def read_last_good(state_dir: Path) -> str | None:
    path = state_dir / LAST_GOOD_FILE
    if not path.exists():
        return None
    sha = path.read_text().strip()
    if not _SHA.match(sha):
        raise StateError(f"{path} does not hold a full 40-hex commit sha: {sha[:60]!r}")
    return sha


def write_last_good(state_dir: Path, sha: str) -> None:
    if not _SHA.match(sha):
        raise StateError(f"refusing to record {sha!r} as last-good: not a full commit sha")
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / LAST_GOOD_FILE).write_text(sha + "\n")


def read_state(state_dir: Path) -> RunState:
    path = state_dir / STATE_FILE
    if not path.exists():
        return RunState()
    try:
        data = json.loads(path.read_text())
        known = {k: data[k] for k in RunState.__dataclass_fields__ if k in data}
        return RunState(**known)
    except (ValueError, TypeError) as exc:
        raise StateError(f"{path} is not valid hourly state JSON: {exc}") from None


def next_state(prev: RunState, status: str, at: datetime, vllm_commit: str, plugin_commit: str) -> RunState:
    """The state after a completed run with ``status`` (pure)."""
    red = status == "red"
    return RunState(
        status=status,
        at=at.isoformat(),
        vllm_commit=vllm_commit,
        plugin_commit=plugin_commit,
        consecutive_red=prev.consecutive_red + 1 if red else 0,
        red_since=(prev.red_since or at.isoformat()) if red else "",
    )


def write_state(state_dir: Path, state: RunState) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).write_text(json.dumps(asdict(state), indent=1, sort_keys=True) + "\n")


def backoff(consecutive_red: int) -> timedelta:
    """Wait between runs while red: 1 h after the first red run, doubling, at most 24 h."""
    if consecutive_red <= 0:
        return timedelta(0)
    return timedelta(hours=min(2 ** (consecutive_red - 1), MAX_BACKOFF_HOURS))


def should_skip(prev: RunState, now: datetime, plugin_commit: str) -> str | None:
    """Why this run may be skipped (back-off while red), or None to run.

    A new plugin commit always runs: it may be the fix.
    """
    if prev.status != "red" or not prev.at:
        return None
    if plugin_commit and prev.plugin_commit and plugin_commit != prev.plugin_commit:
        return None
    wait = backoff(prev.consecutive_red)
    due = parse_time(prev.at) + wait - SLACK
    if now >= due:
        return None
    return (f"back-off while red: {prev.consecutive_red} red run(s) in a row since {prev.red_since}, "
            f"next check due after {(due + SLACK).isoformat()} (every {wait})")
