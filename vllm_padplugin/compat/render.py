"""Render a compat result as text, JSON or Markdown (the Markdown pastes into a fix PR)."""
from __future__ import annotations

import json
import re

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
            moved = f.extra.get("status") == "moved"   # a move the plugin follows: not "bad"
            lines.append(f"    {'moved in commit' if moved else 'first bad commit'}: {_commit(f)}")
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
            lines.append(f"- **{'Moved in commit' if f.extra.get('status') == 'moved' else 'Culprit commit'}:** "
                         f"`{f.first_bad_commit}`"
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


# -- another plugin's tree (--plugin-src): one line per root cause, a ready fix-PR body ----------

def root_causes(findings: list[Finding]) -> list[dict]:
    """Findings grouped by root cause (severity, kind, symbol), breaking first."""
    groups: dict[tuple, dict] = {}
    for f in findings:
        k = (f.severity, f.kind, f.symbol)
        g = groups.get(k)
        if g is None:
            g = groups[k] = {"severity": f.severity, "kind": f.kind, "symbol": f.symbol, "detail": f.detail,
                             "fix": f.fix, "why": f.extra.get("why", ""), "items": [], "plugin_sites": [],
                             "upstream_sites": [], "first_bad_commit": f.first_bad_commit,
                             "commit_subject": f.extra.get("commit_subject"), "findings": 0}
        g["findings"] += 1
        for i in f.extra.get("names", []) or ([f.extra["item"]] if f.extra.get("item") else []):
            if i not in g["items"]:
                g["items"].append(i)
        for s in [f.extra.get("plugin_site")] + list(f.extra.get("plugin_sites", [])):
            if s and s not in g["plugin_sites"]:
                g["plugin_sites"].append(s)
        s = f.extra.get("upstream_site")
        if s and s not in g["upstream_sites"]:
            g["upstream_sites"].append(s)
    return sorted(groups.values(), key=lambda g: (g["severity"] != "breaking", g["kind"], g["symbol"]))


def _symptom(g: dict) -> str:
    m = re.search(r"\b([A-Z]\w*(?:Error|Exception))\b", g["why"] + " " + g["detail"])
    return m.group(1) if m else ("silent: the patch does not reach it" if g["kind"] == "new-binding-site"
                                 else "behaviour change")


def _short(symbol: str) -> str:
    parts = symbol.split(".")
    return ".".join(parts[-2:]) if parts[-1].startswith("__") or len(parts) == 1 else parts[-1]


def _title(g: dict) -> str:
    shown = [i for i in g["items"] if not g["symbol"].endswith(f".{i}")]
    items = f" ({', '.join(shown)})" if shown else ""
    return f"{g['kind']}: {g['symbol']}{items}"


def plugin_text(findings: list[Finding], meta: dict, resolved: list[Finding] = ()) -> str:
    gs = root_causes(findings)
    nb = sum(g["severity"] == "breaking" for g in gs)
    lines = [f"vllm-padplugin compat: plugin {meta.get('plugin', '')} against vLLM "
             f"{meta.get('vllm_version') or '?'} ({meta.get('source', '')})",
             f"{'BREAKING DRIFT' if nb else 'COMPATIBLE'}: {nb} breaking, {len(gs) - nb} info "
             f"(root causes; {len(findings)} findings)"]
    for g in gs:
        if g["severity"] != "breaking":
            lines.append(f"[info] {_title(g)}: {g['detail']}")
            continue
        lines.append(f"[breaking] {_title(g)}")
        lines.append(f"    why: {g['why'] or g['detail']}")
        if g["why"] and g["why"] != g["detail"]:
            lines.append(f"    detail: {g['detail']}")
        lines.append(f"    plugin: {', '.join(g['plugin_sites']) or '?'}")
        lines.append(f"    upstream: {', '.join(g['upstream_sites']) or '(gone)'}")
        if g["first_bad_commit"]:
            lines.append(f"    first bad commit: {g['first_bad_commit']}"
                         + (f" ({g['commit_subject']})" if g["commit_subject"] else ""))
        lines.append(f"    fix: {g['fix']}")
    for f in resolved:
        lines.append(f"[resolved] {f.kind}: {f.symbol} (gone in {f.extra.get('resolved_in', '?')})")
    for e in meta.get("errors", []):
        lines.append(f"error: {e}")
    return "\n".join(lines)


def plugin_markdown(findings: list[Finding], meta: dict, resolved: list[Finding] = ()) -> str:
    """A fix-PR body in vllm-gaudi's FIX_FOR_VLLM style: a table, then one section per bug."""
    gs = root_causes(findings)
    bugs = [g for g in gs if g["severity"] == "breaking"]
    infos = [g for g in gs if g["severity"] != "breaking"]
    target = meta.get("bad") or meta.get("vllm_version") or "?"
    plugin = meta.get("plugin", "the plugin")
    lines = [f"## [FIX_FOR_VLLM_CUSTOM={target}] Fix {len(bugs)} vLLM API-drift break"
             f"{'s' if len(bugs) != 1 else ''} in `{plugin}`", "",
             f"This PR fixes {len(bugs)} break{'s' if len(bugs) != 1 else ''} of `{plugin}` against vLLM "
             f"`{meta.get('vllm_version') or target}`"
             + (f" (range `{meta['good']}..{meta['bad']}`)" if meta.get("good") else "")
             + ", found statically by `vllm-padplugin compat --plugin-src`.", ""]
    if bugs:
        lines += ["| # | Break | Symptom | Plugin site | Upstream |", "|---|---|---|---|---|"]
        for i, g in enumerate(bugs, 1):
            shown = [x for x in g["items"] if not g["symbol"].endswith(f".{x}")]
            lines.append(f"| {i} | {g['kind']}: `{_short(g['symbol'])}`"
                         + (f" ({', '.join(shown)})" if shown else "")
                         + f" | {_symptom(g)} | `{g['plugin_sites'][0] if g['plugin_sites'] else '?'}` | "
                         f"`{g['upstream_sites'][0] if g['upstream_sites'] else '(gone)'}` |")
        lines.append("")
    for i, g in enumerate(bugs, 1):
        lines += [f"## Bug {i}: {_title(g)}", "", "### Root cause", g["detail"], ""]
        if g["why"] and g["why"] != g["detail"]:
            lines += [f"Why it breaks: {g['why']}.", ""]
        lines += ["### Culprit"]
        cul = f"Upstream `{', '.join(g['upstream_sites'])}`" if g["upstream_sites"] else "Upstream: removed"
        if g["first_bad_commit"]:
            cul += f"; first bad commit `{g['first_bad_commit']}`" + (
                f" ({g['commit_subject']})" if g["commit_subject"] else "")
        lines += [cul + ".", "", "### Fix", g["fix"] or "n/a", "",
                  f"Plugin site: {', '.join(f'`{s}`' for s in g['plugin_sites'])}", ""]
    if infos:
        lines += ["<details><summary>Not breaking ({} info)</summary>".format(len(infos)), ""]
        lines += [f"- {_title(g)}: {g['detail']}" for g in infos]
        lines += ["", "</details>", ""]
    if resolved:
        lines += ["### Resolved in range", ""]
        lines += [f"- {f.kind}: `{f.symbol}` (gone in `{f.extra.get('resolved_in', '?')}`)" for f in resolved]
        lines.append("")
    if meta.get("errors"):
        lines += ["### Input errors", ""] + [f"- {e}" for e in meta["errors"]] + [""]
    return "\n".join(lines)


def plugin_json(findings: list[Finding], meta: dict, resolved: list[Finding] = ()) -> str:
    doc = json.loads(as_json(findings, meta, resolved))
    doc["root_causes"] = [{k: v for k, v in g.items()} for g in root_causes(findings)]
    doc["breaking_root_causes"] = sum(g["severity"] == "breaking" for g in doc["root_causes"])
    return json.dumps(doc, indent=2, sort_keys=False)


RENDER = {"text": as_text, "json": as_json, "md": as_markdown}
PLUGIN_RENDER = {"text": plugin_text, "json": plugin_json, "md": plugin_markdown}
