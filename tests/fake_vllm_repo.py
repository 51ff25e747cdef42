"""A tiny stand-in for the vLLM git repository, for tests of ci/hourly (real git, no mocks).

The files are written here, not copied from vLLM: just enough source for every entry of
the plugin's upstream surface (``vllm_padplugin/surface.py``) to be found by the static
compat check, in the shape vLLM main has it (native masking; v2 runner; legacy runner
gone).  ``BREAKS`` are edits that break the surface the way real upstream commits could.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

FM = "vllm/model_executor/layers/fused_moe"

FILES: dict[str, str] = {
    "vllm/__init__.py": '__version__ = "0.35.0.dev0"\n',
    "vllm/envs.py": '''import os

environment_variables = {
    "VLLM_MOE_SKIP_PADDING": lambda: os.getenv("VLLM_MOE_SKIP_PADDING", "1") == "1",
}
''',
    "vllm/forward_context.py": '''from dataclasses import dataclass
from typing import Any


@dataclass
class ForwardContext:
    attn_metadata: Any = None
    is_padding: Any = None


_CTX: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    assert _CTX is not None
    return _CTX


def is_forward_context_available() -> bool:
    return _CTX is not None


def create_forward_context(attn_metadata, vllm_config, num_tokens=None, is_padding=None):
    return ForwardContext(attn_metadata=attn_metadata, is_padding=is_padding)


def set_forward_context(attn_metadata, vllm_config, num_tokens=None, is_padding=None):
    global _CTX
    _CTX = create_forward_context(attn_metadata, vllm_config, num_tokens, is_padding=is_padding)
''',
    "vllm/platforms/__init__.py": '''from typing import TYPE_CHECKING

if TYPE_CHECKING:
    current_platform: object


def __getattr__(name):
    if name == "current_platform":
        return object()
    raise AttributeError(name)
''',
    "vllm/config/__init__.py": "from vllm.config.vllm import get_current_vllm_config\n",
    "vllm/config/vllm.py": "def get_current_vllm_config():\n    return None\n",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/layers/__init__.py": "",
    f"{FM}/__init__.py": "",
    f"{FM}/config.py": '''from dataclasses import dataclass


@dataclass
class FusedMoEParallelConfig:
    use_all2all_kernels: bool = False
    all2all_backend: str = ""

    @property
    def use_deepep_v2_kernels(self) -> bool:
        return self.use_all2all_kernels and self.all2all_backend == "deepep_v2"
''',
    f"{FM}/layer.py": '''from vllm.model_executor.layers.fused_moe.router.router_factory import create_fused_moe_router


class FusedMoE:
    def __init__(self, top_k, num_experts, use_grouped_topk=False, skip_padding=False):
        self.router = create_fused_moe_router(
            top_k=top_k,
            global_num_experts=num_experts,
            use_grouped_topk=use_grouped_topk,
            skip_padding=skip_padding,
        )
''',
    f"{FM}/router/__init__.py": "",
    f"{FM}/router/base_router.py": '''class BaseRouter:
    def __init__(self, top_k):
        self.top_k = top_k

    def _compute_routing(self, hidden_states, router_logits, indices_type=None):
        raise NotImplementedError
''',
    f"{FM}/router/grouped_topk_router.py": '''from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter


class GroupedTopKRouter(BaseRouter):
    def __init__(self, top_k, num_expert_group=1, topk_group=1, skip_padding=False):
        super().__init__(top_k)
        self.skip_padding = skip_padding
''',
    f"{FM}/router/router_factory.py": '''from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import GroupedTopKRouter


def create_fused_moe_router(top_k, global_num_experts, use_grouped_topk=False, skip_padding=False):
    if use_grouped_topk:
        return GroupedTopKRouter(top_k, skip_padding=skip_padding)
    return BaseRouter(top_k)
''',
    "vllm/v1/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/gpu/__init__.py": "",
    "vllm/v1/worker/gpu/ubatch_utils.py": '''from vllm.forward_context import create_forward_context


class UBatchRunner:
    def _make_forward_contexts(self, slices, attn_metadata, vllm_config, is_padding):
        return [
            create_forward_context(attn_metadata, vllm_config, num_tokens=s.stop - s.start,
                                   is_padding=None if is_padding is None else is_padding[s])
            for s in slices
        ]
''',
    "README.md": "fake vLLM for tests of ci/hourly\n",
}

# (file, old text, new text, commit subject): each a break of the plugin's surface.
BREAK_FACTORY = (f"{FM}/router/router_factory.py", "def create_fused_moe_router(top_k,",
                 "def create_fused_moe_router(num_topk,",
                 "[MoE] Rename top_k to num_topk in create_fused_moe_router")
BREAK_DBO = ("vllm/v1/worker/gpu/ubatch_utils.py",
             ",\n                                   is_padding=None if is_padding is None else is_padding[s])",
             ")", "[DBO] Simplify micro-batch forward contexts")


class FakeVllmRepo:
    """A real git repository; ``commit`` returns the new full sha."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")
        # A GitHub-like origin answers fetches of any reachable sha (ci/hourly --fetch-history).
        self.git("config", "uploadpack.allowReachableSHA1InWant", "true")

    def git(self, *args: str) -> str:
        env = {**os.environ, "GIT_AUTHOR_NAME": "Fake Dev", "GIT_AUTHOR_EMAIL": "dev@example.invalid",
               "GIT_COMMITTER_NAME": "Fake Dev", "GIT_COMMITTER_EMAIL": "dev@example.invalid"}
        return subprocess.run(["git", "-C", str(self.path), *args], check=True, capture_output=True,
                              text=True, env=env).stdout.strip()

    def write(self, rel: str, text: str) -> None:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def commit(self, subject: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", subject)
        return self.git("rev-parse", "HEAD")

    def clean(self, subject: str = "Initial fake vLLM tree") -> str:
        for rel, text in FILES.items():
            self.write(rel, text)
        return self.commit(subject)

    def unrelated(self, n: int) -> str:
        self.write("README.md", (self.path / "README.md").read_text() + f"docs change {n}\n")
        return self.commit(f"[Docs] Unrelated change {n}")

    def apply(self, brk: tuple[str, str, str, str]) -> str:
        rel, old, new, subject = brk
        text = (self.path / rel).read_text()
        assert old in text, f"fixture edit does not apply to {rel}: {old!r}"
        self.write(rel, text.replace(old, new))
        return self.commit(subject)

    def move(self, old: str, new: str, subject: str, rewrite: tuple[str, ...] = ()) -> str:
        """``git mv`` a module file (new parent packages get an ``__init__.py``); ``rewrite``:
        files whose ``old`` dotted path is replaced by the new one (their imports)."""
        dst = self.path / new
        dst.parent.mkdir(parents=True, exist_ok=True)
        for d in [dst.parent, *dst.parent.parents]:
            if d == self.path / "vllm" or self.path / "vllm" not in d.parents:
                break
            if not (d / "__init__.py").exists():
                (d / "__init__.py").write_text("")
        self.git("mv", old, new)
        dotted = lambda rel: rel[:-3].replace("/", ".")  # noqa: E731
        for rel in rewrite:
            self.write(rel, (self.path / rel).read_text().replace(dotted(old), dotted(new)))
        return self.commit(subject)

    def restore(self, subject: str) -> str:
        for rel, text in FILES.items():
            if rel != "README.md":
                self.write(rel, text)
        return self.commit(subject)
