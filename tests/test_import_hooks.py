"""import_hooks: post-import callbacks without wrapt, on real modules written to a temp dir.

Each case runs in a fresh interpreter (hooks and sys.modules are per process).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(tmp_path: Path, code: str) -> dict:
    pkg = tmp_path / "hookpkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("import sys\nSEEN_LOADER = __loader__\nVALUE = 41\n")
    (pkg / "broken.py").write_text("import os\nif not os.environ.get('FIXED'):\n    raise ImportError('not yet')\nOK = 1\n")
    (pkg / "reads_name.py").write_text("from hookpkg.target import VALUE\n")
    prog = f"import sys, json\nsys.path[:0] = [{str(tmp_path)!r}, {str(REPO)!r}]\n" + textwrap.dedent(code)
    p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_hook_runs_right_after_import_before_importers_read_names(tmp_path):
    res = _run(tmp_path, """
        from vllm_padplugin.import_hooks import when_imported, pending
        calls = []
        def hook(m):
            calls.append(m.__name__)
            m.VALUE = 42            # patched before anyone reads it
        ran_now = when_imported("hookpkg.target", hook)
        before = (list(calls), pending("hookpkg.target"))
        import hookpkg.reads_name as r
        import hookpkg.target as t
        import importlib.machinery
        print(json.dumps({"ran_now": ran_now, "before": before, "calls": calls, "value_seen": r.VALUE,
                          "pending_after": pending("hookpkg.target"),
                          "real_loader": isinstance(t.__loader__, importlib.machinery.SourceFileLoader),
                          "spec_loader": isinstance(t.__spec__.loader, importlib.machinery.SourceFileLoader),
                          "loader_seen_by_module": type(t.SEEN_LOADER).__name__}))
    """)
    assert res["ran_now"] is False and res["before"] == [[], 1]
    assert res["calls"] == ["hookpkg.target"] and res["value_seen"] == 42 and res["pending_after"] == 0
    assert res["real_loader"] and res["spec_loader"] and res["loader_seen_by_module"] == "SourceFileLoader"


def test_already_imported_runs_at_once(tmp_path):
    res = _run(tmp_path, """
        import hookpkg.target
        from vllm_padplugin.import_hooks import when_imported
        calls = []
        print(json.dumps({"ran_now": when_imported("hookpkg.target", lambda m: calls.append(m.VALUE)),
                          "calls": calls}))
    """)
    assert res == {"ran_now": True, "calls": [41]}


def test_failed_import_keeps_the_hook_for_the_next_attempt(tmp_path):
    res = _run(tmp_path, """
        import os
        from vllm_padplugin.import_hooks import when_imported, pending
        calls = []
        when_imported("hookpkg.broken", lambda m: calls.append(m.OK))
        try:
            import hookpkg.broken
        except ImportError:
            pass
        after_fail = (list(calls), pending("hookpkg.broken"))
        os.environ["FIXED"] = "1"
        import hookpkg.broken
        print(json.dumps({"after_fail": after_fail, "calls": calls}))
    """)
    assert res == {"after_fail": [[], 1], "calls": [1]}


def test_no_wrapt_imported(tmp_path):
    res = _run(tmp_path, """
        from vllm_padplugin.import_hooks import when_imported
        when_imported("hookpkg.target", lambda m: None)
        import hookpkg.target
        print(json.dumps({"wrapt": "wrapt" in sys.modules}))
    """)
    assert res == {"wrapt": False}
