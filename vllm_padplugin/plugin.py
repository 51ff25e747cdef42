"""The loader behind vLLM's two plugin hooks: installs the patches once per process.

vLLM calls platform-plugin hooks, then general-plugin hooks, once per process; with
``VLLM_TARGET_DEVICE=cpu`` platform hooks are never called.  So:

- the platform hook only records that it ran and registers a lazy post-import hook
  (resolving the platform or importing fused_moe from inside platform resolution
  re-enters it and yields two platform objects);
- the general hook does the work: decide the mode, check drift (runtime shim),
  apply ``patches.ALL``, write the report file.

Every hook is idempotent (one installation per process) and never takes vLLM
down: any exception becomes ONE warning naming the cause and vLLM keeps upstream
behaviour; with ``PADPLUGIN_STRICT=1`` it raises (``state.fail``, the one home of
failure recording).

Load cost matters (every vLLM process pays it: front end, engine core, each worker):
this module imports only ``state`` at import time; the drift check answers from the
per-install cache when the installed files are unchanged (``shim``, ``install_cache``);
post-import hooks come from ``import_hooks`` (no wrapt); patch and compat modules are
imported when used.
"""
from __future__ import annotations

import logging

from vllm_padplugin import state

logger = logging.getLogger("vllm_padplugin")


def on_platform_hook() -> None:
    """Record the call; arrange installation right after the router factory is imported."""
    try:
        with state.LOCK:
            if state.STATE.platform_hook_ran:
                return
            state.STATE.platform_hook_ran = True
        from vllm_padplugin import relocate
        from vllm_padplugin.import_hooks import when_imported

        # Never run now (the platform may be resolving): only once the factory module is imported
        # (where the installed vLLM keeps it: relocate follows moves, reading files only).
        when_imported(relocate.module_of("router_factory"),
                      state.safe_hook(lambda _m: ensure_installed("post-import")))
    except Exception as exc:
        state.fail("platform hook", exc)


def on_general_hook() -> None:
    try:
        with state.LOCK:
            state.STATE.general_hook_ran = True
        ensure_installed("general hook")
    except Exception as exc:
        state.fail("general hook", exc)


def make_env():
    """The loader's view of this process (resolves the platform: general hook only)."""
    import vllm

    from vllm_padplugin.patches.base import Env
    from vllm_padplugin.platforms import current_device_type, decide_mode

    device = current_device_type()
    return Env(
        vllm_version=str(getattr(vllm, "__version__", "unknown")),
        device_type=device,
        mode=decide_mode(device),
        strict=state.strict(),
    )


def ensure_installed(source: str = "general hook") -> None:
    """Install once: mode, drift check, patches, report file."""
    with state.LOCK:
        if state.STATE.installed:
            return
        state.STATE.installed = True  # set first: re-entry (post-import inside apply) is a no-op
    try:
        env = make_env()
        with state.LOCK:
            state.STATE.mode = env.mode
            state.STATE.device_type = env.device_type
        try:
            _check_drift(env)
        except Exception as exc:
            state.fail("drift check", exc)
        from vllm_padplugin.patches import apply_all

        applied, _sites = apply_all(env, state.patch_failed)
        with state.LOCK:
            state.STATE.applied_patches = applied
        logger.info("vllm_padplugin: mode %s on %s (vLLM %s) via %s; patches: %s",
                    env.mode, env.device_type, env.vllm_version, source, ", ".join(applied) or "none")
    except Exception as exc:
        state.fail(f"installation ({source})", exc)
    finally:
        _write_report()


def _check_drift(env) -> None:
    """Runtime shim (vllm_padplugin.shim, when present): findings go to the report."""
    try:
        from vllm_padplugin import shim
    except ImportError:
        return
    findings = shim.check_loaded_vllm()
    with state.LOCK:
        state.STATE.drift = [f.to_dict() for f in findings]
    shim.emit(findings, env.strict)


def _write_report() -> None:
    try:
        from vllm_padplugin.report import write_report_file

        write_report_file()
    except Exception as exc:
        state.fail("writing the report file", exc)
