"""Our environment variables must not trip vLLM's own environment validation.

vLLM treats every unknown ``VLLM_*`` variable as an error under
``--fail-on-environ-validation`` (a warning otherwise), so the plugin's variables are
named ``PADPLUGIN_*``.  Real vLLM, real validation function.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm

OURS = {
    "PADPLUGIN_STRICT": "0",
    "PADPLUGIN_REPORT_DIR": "/tmp/padplugin-reports",
    "PADPLUGIN_FORCE_MODE": "passthrough",
    "PADPLUGIN_CACHE": "/tmp/padplugin-cache",
}


def _validate_hard():
    """vLLM 0.32 moved the check onto the platform; 0.30 has it in vllm.envs."""
    pytest.importorskip("vllm")
    from vllm import envs

    if hasattr(envs, "validate_environ"):
        return envs.validate_environ
    from vllm.platforms import current_platform

    return current_platform.validate_environ


def test_our_variables_pass_strict_vllm_validation(monkeypatch):
    validate = _validate_hard()
    for k, v in OURS.items():
        monkeypatch.setenv(k, v)
    validate(True)  # raises ValueError on an unknown VLLM_* variable


def test_a_vllm_prefixed_name_would_fail(monkeypatch):
    """Why the prefix matters: the same variable under VLLM_ stops vLLM from starting."""
    validate = _validate_hard()
    monkeypatch.setenv("VLLM_PADPLUGIN_STRICT", "0")
    with pytest.raises(ValueError, match="VLLM_PADPLUGIN_STRICT"):
        validate(True)
