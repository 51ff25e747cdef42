"""Markers on the objects the plugin installs, and the tests for them (no imports).

The report, the binding-site scan, the patches and the factory wrapper all need to ask
"is this one of ours?"; asking here keeps them from importing each other for it.
The tests read the object's own ``__dict__`` only: vLLM has lazy placeholder
modules/objects whose ``__getattr__`` raises non-AttributeError exceptions.
"""
from __future__ import annotations

import types
from typing import Any

FACTORY_MARK = "__padplugin_factory__"   # on our create_fused_moe_router wrappers


def is_ours(func: Any) -> bool:
    """Our router-factory wrapper?"""
    return isinstance(func, types.FunctionType) and bool(func.__dict__.get(FACTORY_MARK, False))
