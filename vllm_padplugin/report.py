"""What the plugin sees and does in this process, as one dict (CLI, demo, report files).

``build_report()`` never imports heavy vLLM modules itself: it reads the plugin
state and what is already imported (``vllm``, the platform when resolved).
With ``PADPLUGIN_REPORT_DIR`` set, the plugin writes ``<dir>/report-<pid>.json``
at load and after every router-factory call (model build time, never per forward),
so tests and users can see the plugin ran in engine-core and worker processes.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from vllm_padplugin import __version__, state

REPORT_DIR_ENV = "PADPLUGIN_REPORT_DIR"
ENTRY_GROUPS = ("vllm.platform_plugins", "vllm.general_plugins")


def allowed_plugins() -> list[str] | None:
    """VLLM_PLUGINS as vLLM parses it (None = every plugin allowed)."""
    raw = os.environ.get("VLLM_PLUGINS")
    return None if raw is None else raw.split(",")


def entry_points_info() -> list[dict]:
    """Our entry points as installed, and whether VLLM_PLUGINS lets vLLM load each."""
    from importlib.metadata import entry_points

    allow = allowed_plugins()
    out = []
    for group in ENTRY_GROUPS:
        for ep in entry_points(group=group):
            if ep.value.split(":")[0].split(".")[0] != "vllm_padplugin":
                continue
            out.append({
                "group": group,
                "name": ep.name,
                "value": ep.value,
                "found": True,
                "allowed": allow is None or ep.name in allow,
            })
    return out


def _vllm_version() -> str | None:
    mod = sys.modules.get("vllm")
    return None if mod is None else str(getattr(mod, "__version__", "unknown"))


def _platform() -> str | None:
    st = state.STATE
    if st.device_type:
        return st.device_type
    platforms = sys.modules.get("vllm.platforms")
    cp = getattr(platforms, "_current_platform", None) if platforms else None
    return getattr(cp, "device_type", None) if cp is not None else None


def _binding_sites() -> list[str]:
    """Sites we rebound, plus modules that copied our wrapper by import since (live scan)."""
    sites = list(state.STATE.binding_sites)
    if state.STATE.factory_installed:
        from vllm_padplugin.binding_sites import holders, site_name
        from vllm_padplugin.marks import is_ours

        sites += [s for s in (site_name(m, a) for m, a in holders(is_ours)) if s not in sites]
    return sites


def build_report() -> dict:
    """The report of THIS process (same dict the CLI prints and the report files hold)."""
    st = state.STATE
    with state.LOCK:
        eps = entry_points_info()
        sites = _binding_sites()
        return {
            "vllm_version": _vllm_version(),
            "platform": _platform(),
            "plugin_version": __version__,
            "entry_points": eps,
            "entry_points_found": bool(eps),
            "entry_points_allowed": bool(eps) and all(e["allowed"] for e in eps),
            "vllm_plugins_env": os.environ.get("VLLM_PLUGINS"),
            "mode": st.mode,
            "loaded": st.installed,
            "hooks": {"platform": st.platform_hook_ran, "general": st.general_hook_ran},
            "factory_installed": st.factory_installed,
            "applied_patches": list(st.applied_patches),
            "binding_sites": sites,
            "foreign_factories": list(st.foreign_factories),
            "drift": list(st.drift),
            "errors": list(st.errors),
            "factory_calls": st.factory_calls,
            "routers_built": dict(st.routers_built),
            "skip_padding_requested": st.skip_padding_requested,
            "masked_routers": st.masked_routers,
            "strict": state.strict(),
            "pid": os.getpid(),
            "argv0": sys.argv[0] if sys.argv else "",
        }


def write_report_file() -> Path | None:
    """Write ``<PADPLUGIN_REPORT_DIR>/report-<pid>.json`` (atomic rename) if the env is set."""
    d = os.environ.get(REPORT_DIR_ENV)
    if not d:
        return None
    path = Path(d) / f"report-{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(build_report(), indent=2, default=str))
    os.replace(tmp, path)
    return path


def format_text(rep: dict) -> str:
    """Human-readable report."""
    eps = rep.get("entry_points") or []
    ep_txt = ", ".join(f"{e['group']}:{e['name']} ({'allowed' if e['allowed'] else 'EXCLUDED by VLLM_PLUGINS'})"
                       for e in eps) or "none found (plugin not installed as a distribution?)"
    lines = [
        f"vllm_padplugin {rep['plugin_version']}  (pid {rep['pid']})",
        f"  vLLM:           {rep['vllm_version'] or 'not imported'}",
        f"  platform:       {rep['platform'] or 'unknown'}",
        f"  entry points:   {ep_txt}",
        f"  loaded:         {rep['loaded']}  (hooks: platform={rep['hooks']['platform']}, general={rep['hooks']['general']})"
        + ("  <- VLLM_PLUGINS excludes padplugin" if eps and not rep["entry_points_allowed"] else ""),
        f"  mode:           {rep['mode'] or '-'}",
        f"  patches:        {', '.join(rep['applied_patches']) or '-'}",
        f"  binding sites:  {', '.join(rep['binding_sites']) or '- (router factory not imported in this process yet)'}",
        f"  foreign:        {', '.join(rep['foreign_factories']) or '-'}",
        f"  factory calls:  {rep['factory_calls']}  routers: {rep['routers_built'] or '-'}  masked: {rep['masked_routers']}",
        f"  drift:          {len(rep['drift'])} finding(s)",
    ]
    for f in rep["drift"]:
        lines.append(f"    - [{f.get('severity')}] {f.get('kind')} {f.get('symbol')}: {f.get('detail')}")
    for e in rep["errors"]:
        lines.append(f"  error: {e}")
    return "\n".join(lines)
