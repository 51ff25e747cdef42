"""The plugin's upstream surface: every vLLM symbol it wraps, rebinds, reads or relies on.

One registry, used by the patches themselves (they look symbols up through it), by
the runtime shim (checked at load) and by ``vllm-padplugin compat`` (checked
statically against a source tree or a git range).  Adding a patch means adding
its symbols here first; nothing else keeps a second list that could drift.

Pure data, no vLLM import.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Kind(str, enum.Enum):
    MODULE = "module"
    FUNCTION = "function"
    CLASS = "class"
    METHOD = "method"          # qualname "Class.method"
    FIELD = "field"            # dataclass field / attribute read, qualname "Class.attr"
    PROPERTY = "property"      # qualname "Class.prop"
    ENV = "env"                # qualname is the variable name, module is vllm.envs
    PROPAGATION = "propagation"  # a call inside ``qualname`` must pass ``params`` to ``callee``


class Use(str, enum.Enum):
    WRAP = "wrap"          # we replace it with a wrapper that calls the original
    REBIND = "rebind"      # we rebind every module attribute bound to it (binding sites)
    SUBCLASS = "subclass"  # we derive from it: every abstract method must stay implemented
    ASSIGN = "assign"      # we assign to it: must not become a read-only property
    READ = "read"
    CALL = "call"          # we call it with ``params``
    CHECK = "check"        # behaviour we rely on (mask propagation)


@dataclass(frozen=True)
class Symbol:
    """One upstream symbol the plugin touches."""

    key: str                   # short stable id, used by patches and in reports
    module: str                # dotted module path
    qualname: str              # name inside the module ("" for the module itself)
    kind: Kind
    use: Use
    why: str
    on_change: str
    params: tuple[str, ...] = ()          # parameters we pass / rely on / expect
    callee: str = ""                      # PROPAGATION: the function that must receive params
    default: str | None = None            # ENV: the default we rely on
    moved_to: tuple[str, ...] = ()        # known later homes ("module:qualname"): info, not breaking
    optional: bool = False                # absent is fine (e.g. the legacy runner, removed in 0.34)
    tracks: str = ""                      # upstream PR / release this entry is about
    sites: tuple[str, ...] = ()           # REBIND: binding sites known to us (others: info)
    backport: tuple[str, ...] = ()        # params our backport supplies when upstream lacks them:
                                          # their absence is info in backport mode, breaking in native
    lazy: bool = False                    # provided by the module's __getattr__ by design (read only)

    @property
    def path(self) -> str:
        return f"{self.module}.{self.qualname}" if self.qualname else self.module


FUSED_MOE = "vllm.model_executor.layers.fused_moe"
ROUTER = f"{FUSED_MOE}.router"

SURFACE: tuple[Symbol, ...] = (
    Symbol(
        key="router_factory",
        module=f"{ROUTER}.router_factory",
        qualname="create_fused_moe_router",
        kind=Kind.FUNCTION,
        use=Use.WRAP,
        why="Every MoE layer builds its router here; our wrapper accepts skip_padding on every "
        "vLLM and masks padded rows where upstream does not.",
        on_change="Our wrapper mirrors the installed signature at load; a parameter upstream "
        "callers pass that the wrapped factory lacks is a TypeError at model build.",
        params=("top_k", "global_num_experts", "use_grouped_topk", "skip_padding"),
        backport=("skip_padding",),
        tracks="vLLM PR #56079 (0.31) added skip_padding",
    ),
    Symbol(
        key="router_factory_binding_sites",
        module=f"{ROUTER}.router_factory",   # where it is defined; binding sites import it by name
        qualname="create_fused_moe_router",
        kind=Kind.FUNCTION,
        use=Use.REBIND,
        why="Modules that did `from ... import create_fused_moe_router` keep the original "
        "object; each must be rebound (layer.py; models/step5/nvidia/mega_moe.py since 0.33).",
        on_change="A new binding site that we do not rebind builds routers that never mask.",
        sites=(f"{FUSED_MOE}.layer", "vllm.models.step5.nvidia.mega_moe"),
    ),
    Symbol(
        key="grouped_topk_router",
        module=f"{ROUTER}.grouped_topk_router",
        qualname="GroupedTopKRouter",
        kind=Kind.CLASS,
        use=Use.READ,
        why="Upstream masks natively in GroupedTopKRouter when built with skip_padding "
        "(0.31+); we detect that to avoid masking twice.",
        on_change="If skip_padding leaves __init__, native masking is gone and we must backport.",
        params=("skip_padding",),
        backport=("skip_padding",),
        tracks="vLLM PR #56079",
    ),
    Symbol(
        key="compute_routing",
        module=f"{ROUTER}.base_router",
        qualname="BaseRouter._compute_routing",
        kind=Kind.METHOD,
        use=Use.WRAP,
        why="The backport masks the result of _compute_routing (same place as upstream: "
        "before EPLB mapping and routing capture).",
        on_change="A renamed or re-signed _compute_routing leaves the backport unapplied.",
        params=("hidden_states", "router_logits", "indices_type"),
    ),
    Symbol(
        key="forward_context_is_padding",
        module="vllm.forward_context",
        qualname="ForwardContext.is_padding",
        kind=Kind.FIELD,
        use=Use.READ,
        why="The persistent padding mask the router reads per forward.",
        on_change="Without it no row can be known as padding: masking turns off (one warning).",
    ),
    Symbol(
        key="get_forward_context",
        module="vllm.forward_context",
        qualname="get_forward_context",
        kind=Kind.FUNCTION,
        use=Use.CALL,
        why="Reads the current forward context inside routing.",
        on_change="Masking turns off (one warning).",
    ),
    Symbol(
        key="is_forward_context_available",
        module="vllm.forward_context",
        qualname="is_forward_context_available",
        kind=Kind.FUNCTION,
        use=Use.CALL,
        why="Routing outside a forward (profiling, tests) must not fail.",
        on_change="We fall back to catching the missing-context error.",
    ),
    Symbol(
        key="create_forward_context",
        module="vllm.forward_context",
        qualname="create_forward_context",
        kind=Kind.FUNCTION,
        use=Use.CALL,
        why="DBO micro-batch contexts are built here; the backport passes the sliced mask.",
        on_change="Micro-batches lose their padding mask.",
        params=("is_padding",),
    ),
    Symbol(
        key="set_forward_context",
        module="vllm.forward_context",
        qualname="set_forward_context",
        kind=Kind.FUNCTION,
        use=Use.CALL,
        why="The legacy GPU runner's forward context; the backport supplies is_padding to it.",
        on_change="The legacy runner's forwards carry no mask.",
        params=("is_padding", "num_tokens"),
    ),
    Symbol(
        key="legacy_runner",
        module="vllm.v1.worker.gpu_model_runner",
        qualname="GPUModelRunner",
        kind=Kind.CLASS,
        use=Use.WRAP,
        why="Before 0.31 the legacy runner never filled is_padding; the backport does.",
        on_change="Removed in 0.34 (the v2 runner took over): nothing to backport there.",
        optional=True,
        moved_to=("vllm.v1.worker.gpu.model_runner:GPUModelRunner",),
        tracks="vLLM PR #56079",
    ),
    Symbol(
        key="dbo_mask_propagation_legacy",
        module="vllm.v1.worker.gpu_ubatch_wrapper",
        qualname="UBatchWrapper._make_ubatch_metadata",
        kind=Kind.PROPAGATION,
        use=Use.CHECK,
        callee="create_forward_context",
        params=("is_padding",),
        why="DBO micro-batch contexts must carry the sliced is_padding, or each micro-batch's "
        "padded rows are routed again.",
        on_change="Lost propagation: padded rows of every micro-batch reach experts.",
        optional=True,
        backport=("is_padding",),
        moved_to=("vllm.v1.worker.gpu.ubatch_utils:UBatchRunner._make_forward_contexts",),
        tracks="vLLM PR #56079",
    ),
    Symbol(
        key="dbo_mask_propagation_v2",
        module="vllm.v1.worker.gpu.ubatch_utils",
        qualname="UBatchRunner._make_forward_contexts",
        kind=Kind.PROPAGATION,
        use=Use.CHECK,
        callee="create_forward_context",
        params=("is_padding",),
        why="The v2 runner's micro-batch contexts must carry the sliced is_padding.",
        on_change="Lost propagation: padded rows of every micro-batch reach experts.",
        optional=True,
    ),
    Symbol(
        key="skip_padding_env",
        module="vllm.envs",
        qualname="VLLM_MOE_SKIP_PADDING",
        kind=Kind.ENV,
        use=Use.READ,
        default="1",
        why="The user's switch: 0 turns masking off, upstream and ours alike.",
        on_change="Removed: we keep honouring the variable ourselves; default changed: we follow it.",
    ),
    Symbol(
        key="use_deepep_v2_kernels",
        module=f"{FUSED_MOE}.config",
        qualname="FusedMoEParallelConfig.use_deepep_v2_kernels",
        kind=Kind.PROPERTY,
        use=Use.READ,
        why="Masking applies only when the all2all backend is DeepEP v2 (it skips -1 ids).",
        on_change="We fall back to parallel_config.all2all_backend == 'deepep_v2'.",
    ),
    Symbol(
        key="current_platform",
        module="vllm.platforms",
        qualname="current_platform",
        kind=Kind.FIELD,
        use=Use.READ,
        why="The loader reads current_platform.device_type to choose the mode (lazy module attribute).",
        lazy=True,
        on_change="Mode detection falls back to passthrough (no masking), one warning.",
    ),
    Symbol(
        key="get_current_vllm_config",
        module="vllm.config",
        qualname="get_current_vllm_config",
        kind=Kind.FUNCTION,
        use=Use.CALL,
        why="The router reads the current vLLM config to know whether DeepEP v2 is the all2all backend.",
        on_change="No config readable: DeepEP v2 is assumed off, nothing is masked.",
    ),
    Symbol(
        key="fused_moe_layer",
        module=f"{FUSED_MOE}.layer",
        qualname="",
        kind=Kind.MODULE,
        use=Use.REBIND,
        why="The main binding site of the router factory.",
        on_change="A moved or lazily forwarded module is not reached by rebinding.",
    ),
)

BY_KEY: dict[str, Symbol] = {s.key: s for s in SURFACE}


def get(key: str) -> Symbol:
    """The registry entry ``key`` (KeyError names the known keys)."""
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown surface key {key!r}; known: {sorted(BY_KEY)}") from None


@dataclass
class Finding:
    """One drift finding, shared by the runtime shim and the static compat check."""

    kind: str            # drift class, e.g. "signature-missing-param", "symbol-removed"
    symbol: str          # dotted path
    detail: str
    severity: str = "breaking"   # "breaking" | "info"
    fix: str = ""
    key: str = ""                # surface key, when it came from the registry
    first_bad_commit: str | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {
            "kind": self.kind,
            "symbol": self.symbol,
            "detail": self.detail,
            "severity": self.severity,
            "fix": self.fix,
            "key": self.key,
        }
        if self.first_bad_commit is not None:
            d["first_bad_commit"] = self.first_bad_commit
        d.update(self.extra)
        return d
