"""Build a tiny DeepSeek-V3-style MoE checkpoint locally, with random weights.

Why: the main job and the engine tests need a real MoE model that routes with
grouped top-k + sigmoid + ``e_score_correction_bias`` (the router the plugin
targets), without any hub access and small enough for 2 CPU cores.  The
checkpoint is built once per config and cached in a directory whose name is a
hash of everything that shapes the weights, so reruns are instant.

Settings that vLLM CPU needs (measured, see shared/README.md):
``topk_method="noaux_tc"`` (else vLLM creates no correction bias),
``kv_lora_rank=512`` and ``qk_rope_head_dim=64`` (the CPU MLA backend only
supports a 576-wide latent cache).  No tokenizer: callers pass prompt token ids
and ``skip_tokenizer_init=True``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

#: Fields of transformers' ``DeepseekV3Config`` overriding its (671B) defaults.
#: ``topk_method`` and ``scoring_func`` are not DeepseekV3Config fields; vLLM reads
#: them with ``getattr(config, ...)`` so they are stored as extra config attributes.
TINY_DEEPSEEK_V3: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,  # dense MLP of the first layer(s)
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,  # layer 0 dense, layers 1..2 MoE
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "num_experts_per_tok": 4,
    "n_group": 4,  # grouped top-k: 4 groups of 4 experts ...
    "topk_group": 2,  # ... of which the best 2 groups are eligible
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "q_lora_rank": 32,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "max_position_embeddings": 512,
    "num_nextn_predict_layers": 0,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
}

#: Bumped when the way weights are drawn changes, so old caches are not reused.
_RECIPE = 3


def default_cache_root() -> Path:
    base = os.environ.get("PADPLUGIN_CACHE") or Path.home() / ".cache" / "vllm_padplugin"
    return Path(base) / "models"


def config_key(overrides: dict[str, Any], seed: int) -> str:
    """Stable short hash of everything that shapes the checkpoint.

    The transformers version is part of it: the order and packing of parameters
    the random draw walks over may differ between versions.
    """
    import transformers

    blob = json.dumps({"cfg": overrides, "seed": seed, "recipe": _RECIPE,
                       "transformers": transformers.__version__}, sort_keys=True)
    return "tiny-deepseek-v3-" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def _write_checkpoint(out: Path, overrides: dict[str, Any], seed: int) -> None:
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(**overrides)
    config.architectures = ["DeepseekV3ForCausalLM"]
    # bf16: vLLM CPU's AMX MLA backend refuses float32 weights.
    config.dtype = "bfloat16"
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                # Non-zero bias so the correction actually changes expert choice.
                p.copy_(torch.randn_like(p) * 0.1)
            elif "norm" in name:
                p.fill_(1.0)
            elif p.dim() >= 2 and "embed_tokens" not in name:
                # ~unit-variance activations, so the greedy tokens depend on the
                # prompt and on expert choice (a constant output proves nothing).
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
            else:
                p.copy_(torch.randn_like(p))
        # e_score_correction_bias is a buffer in some transformers versions.
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.1)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    # vLLM reads these two from config.json via getattr; make sure they are there
    # whatever transformers does with unknown kwargs.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["topk_method"] = overrides["topk_method"]
    cfg["scoring_func"] = overrides["scoring_func"]
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def build_tiny_model(cache_root: Path | str | None = None, *, seed: int = 0,
                     **overrides: Any) -> Path:
    """Return the directory of a cached tiny DeepSeek-V3 checkpoint, building it if absent.

    ``overrides`` change fields of :data:`TINY_DEEPSEEK_V3` (and the cache key).
    Written to a temporary sibling and renamed, so a crash never leaves a
    half-written checkpoint that later runs would trust.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = {**TINY_DEEPSEEK_V3, **overrides}
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    out = root / config_key(cfg, seed)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=root))
    try:
        _write_checkpoint(tmp, cfg, seed)
        tmp.chmod(0o755)
        try:
            tmp.rename(out)
        except OSError:  # another process won the race: use its copy
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def prompt_token_ids(n: int = 8, seed: int = 0, vocab_size: int | None = None) -> list[int]:
    """A fixed prompt of ``n`` token ids (no tokenizer needed), away from bos/eos."""
    vocab = vocab_size or TINY_DEEPSEEK_V3["vocab_size"]
    return [2 + (seed * 7919 + i * 104729) % (vocab - 2) for i in range(n)]


if __name__ == "__main__":
    print(build_tiny_model())
