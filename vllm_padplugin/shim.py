"""Runtime drift shim: check the plugin's registry against the vLLM imported in this process.

``check_loaded_vllm()`` runs the same drift classes as ``vllm-padplugin compat``
(``compat.checks.check_surface``) through a ``RuntimeView`` (``runtime_view``): for modules
already imported it asks the live objects (``inspect``: signatures, properties, abstract
methods, module ``__getattr__``); for what only the source can tell (calls inside a
function, the env defaults in ``vllm/envs.py``) and for modules not imported yet, it reads
the installed files statically, so checking never imports vLLM modules (no import side
effects).

Per-install cache (``install_cache``, kind ``"drift"``): every vLLM process (front end,
engine core, each worker) runs this check at load, but the answer only changes when what
it reads does.  The check reads two things: installed files (each read is recorded with
its stamp) and live objects (each question put to ``live_answers`` is recorded with its
answer).  The findings are stored with both; a later process reuses them only when every
recorded file has the same stamp AND every recorded live question gets the same answer
now (re-asked: a few ``inspect`` calls, nothing parsed, ``compat.*`` not imported).  The
check being a function of those answers, the reused findings are the ones it would
compute; a changed, added or removed file, or a live object another plugin replaced, makes
the entry stale and the check runs afresh.  ``PADPLUGIN_INSTALL_CACHE=0`` turns it off.

``emit(findings, strict)`` logs one line per finding on logger ``vllm_padplugin``
(WARNING for breaking, INFO for info), or in strict mode raises one ``DriftError`` that
lists every breaking finding.  Never silent, never fatal outside strict mode.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from . import install_cache, live_answers
from .surface import SURFACE, Finding

logger = logging.getLogger("vllm_padplugin")

CACHE_KIND = "drift"
CHECK_VERSION = 1   # bump when what the check computes changes without a code-stamp change
LAST: dict = {}     # how the last check in this process was answered (tests, bench): {"cache": ...}


class DriftError(RuntimeError):
    """Strict mode (PADPLUGIN_STRICT=1): breaking drift found at load."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        lines = [f"{len(findings)} breaking vLLM drift(s) for vllm_padplugin:"]
        lines += [f"  - {f.kind}: {f.symbol}: {f.detail} (fix: {f.fix})" for f in findings]
        super().__init__("\n".join(lines))


vllm_root = install_cache.vllm_root   # where the installed vLLM lives (not imported)


def __getattr__(name: str):
    """``shim.RuntimeView`` / ``shim.runtime_params``: imported on first use (keeps load light)."""
    if name in ("RuntimeView", "runtime_params"):
        from . import runtime_view

        return getattr(runtime_view, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_loaded_vllm(surface=SURFACE) -> list[Finding]:
    """Drift of ``surface`` against this process's vLLM.  Never raises: a failure of the check
    itself comes back as one breaking finding (so strict mode still stops)."""
    try:
        root = vllm_root()
        if root is None:
            LAST.update(cache="none")
            return [Finding("vllm-missing", "vllm", "vLLM is not installed in this Python",
                            "breaking", "Install vLLM; the plugin only works beside it.")]
        cacheable = surface is SURFACE and install_cache.enabled()
        ident = install_cache.identity(root, check=CHECK_VERSION, relocation=_relocation_digest()) \
            if cacheable else None
        if ident is not None:
            hit = install_cache.load(CACHE_KIND, ident)
            if hit is not None and live_answers.replay(hit["answers"]):
                LAST.update(cache="hit")
                return [Finding(**d) for d in hit["findings"]]
        with install_cache.recording() as files:
            findings, view = _check(root, surface)
        stored = False
        if ident is not None:
            stored = install_cache.store(CACHE_KIND, ident, files, {
                "findings": [dataclasses.asdict(f) for f in findings],
                "answers": view.recorded(),
            })
        LAST.update(cache="stored" if stored else "miss", live=view.live)
        return findings
    except Exception as e:  # the shim must never take vLLM down
        LAST.update(cache="error")
        return [Finding("check-failed", "vllm_padplugin.shim", f"drift check failed: {type(e).__name__}: {e}",
                        "breaking", "Report this to vllm_padplugin with the vLLM version.")]


def _relocation_digest() -> str | None:
    """Digest of where this process's relocation puts every registry symbol (``relocate``, resolved
    once per process and cached per install on its own dependencies): the findings were computed for
    one relocation and are reused for that one only."""
    try:
        from . import relocate

        return install_cache.digest(relocate.to_dict(relocate.installed()))
    except Exception:   # no relocation module / it failed: the check itself will say so
        return None


def _check(root: Path, surface):
    """The check itself: ``compat`` over a ``RuntimeView`` of ``root`` (imports compat.* here)."""
    from .compat.checks import check_surface
    from .compat.source import DirReader, Tree
    from .runtime_view import RuntimeView

    view = RuntimeView(Tree(DirReader(root)))
    findings = check_surface(view, surface)
    for err in view.tree.errors:
        findings.append(Finding("source-unreadable", "vllm", f"installed vLLM file does not parse: {err}",
                                "info", "Reinstall vLLM."))
    return findings, view


def emit(findings: list[Finding], strict: bool) -> list[str]:
    """One log line per finding (WARNING breaking, INFO info); strict: one DriftError on breaking."""
    lines = []
    for f in findings:
        msg = f"vLLM drift [{f.severity}] {f.kind}: {f.symbol}: {f.detail}" + (f" Fix: {f.fix}" if f.fix else "")
        logger.log(logging.WARNING if f.severity == "breaking" else logging.INFO, msg)
        lines.append(msg)
    breaking = [f for f in findings if f.severity == "breaking"]
    if strict and breaking:
        raise DriftError(breaking)
    return lines
