"""Render a compat result as text, JSON or Markdown (the Markdown pastes into a fix PR)."""
from __future__ import annotations

import json

from ..surface import Finding


def summary(findings: list[Finding], **meta) -> dict:
    breaking = sum(f.severity == "breaking" for f in findings)
    return {
        "compatible": breaking == 0,
        "breaking": breaking,
        "info": len(findings) - breaking,
        **meta,
    }


def as_json(findings: list[Finding], meta: dict, resolved: list[Finding] = ()) -> str:
    doc = {"findings": [f.to_dict() for f in findings], **summary(findings, **meta)}
    if resolved:
        doc["resolved"] = [f.to_dict() for f in resolved]
    return json.dumps(doc, indent=2, sort_keys=False)


def _commit(f: Finding) -> str:
    if not f.first_bad_commit:
        return ""
    subj = f.extra.get("commit_subject")
    pre = "present at or before good " if f.extra.get("before_good") else ""
    return f"{pre}{f.first_bad_commit}" + (f" ({subj})" if subj else "")


def as_text(findings: list[Finding], meta: dict, resolved: list[Finding] = ()) -> str:
    s = summary(findings, **meta)
    lines = [f"vllm-padplugin compat: {meta.get('source', '')}"
             + (f" (vLLM {meta['vllm_version']})" if meta.get("vllm_version") else ""),
             f"{'COMPATIBLE' if s['compatible'] else 'BREAKING DRIFT'}: {s['breaking']} breaking, "
             f"{s['info']} info" + (f"; masking mode: {meta['mode']}" if meta.get("mode") else "")]
    for f in sorted(findings, key=lambda f: (f.severity != "breaking", f.symbol)):
        lines.append(f"[{f.severity}] {f.kind}: {f.symbol}")
        lines.append(f"    {f.detail}")
        if f.fix:
            lines.append(f"    fix: {f.fix}")
        if f.first_bad_commit:
            lines.append(f"    first bad commit: {_commit(f)}")
        if f.extra.get("plugin_site"):
            lines.append(f"    plugin site: {f.extra['plugin_site']}")
    for f in resolved:
        lines.append(f"[resolved] {f.kind}: {f.symbol} (gone in {f.extra.get('resolved_in', '?')})")
    for e in meta.get("errors", []):
        lines.append(f"error: {e}")
    return "\n".join(lines)


def as_markdown(findings: list[Finding], meta: dict, resolved: list[Finding] = ()) -> str:
    s = summary(findings, **meta)
    head = "compatible" if s["compatible"] else "breaking drift"
    lines = [f"## vLLM compat: {head} ({s['breaking']} breaking, {s['info']} info)", "",
             f"Checked: `{meta.get('source', '')}`"
             + (f", vLLM `{meta['vllm_version']}`" if meta.get("vllm_version") else "")
             + (f", range `{meta['good']}..{meta['bad']}`" if meta.get("good") else ""), ""]
    for f in sorted(findings, key=lambda f: (f.severity != "breaking", f.symbol)):
        lines += [f"### [{f.severity}] {f.kind}: `{f.symbol}`", "",
                  f"- **Root cause:** {f.detail}"]
        if f.first_bad_commit:
            lines.append(f"- **Culprit commit:** `{f.first_bad_commit}`"
                         + (f" ({f.extra['commit_subject']})" if f.extra.get("commit_subject") else "")
                         + (" (already present at the good revision)" if f.extra.get("before_good") else ""))
        if f.extra.get("plugin_site"):
            lines.append(f"- **Plugin site:** `{f.extra['plugin_site']}`")
        lines += [f"- **Suggested fix:** {f.fix or 'n/a'}", ""]
    if resolved:
        lines += ["### Resolved in range", ""]
        lines += [f"- {f.kind}: `{f.symbol}` (gone in `{f.extra.get('resolved_in', '?')}`)" for f in resolved]
        lines.append("")
    if meta.get("errors"):
        lines += ["### Input errors", ""] + [f"- {e}" for e in meta["errors"]] + [""]
    return "\n".join(lines)


RENDER = {"text": as_text, "json": as_json, "md": as_markdown}
