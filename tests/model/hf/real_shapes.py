#!/usr/bin/env python3
"""zinf eval against transformers at real models' shapes (random weights).

The parity fixtures beside this file are tiny; this checks the shapes the
real checkpoints have (head sizes, GQA ratios, rotary dims, vocabularies) in
one forward: a random-init bf16 folder of the named shape, 2 x 256 random
tokens, transformers' loss in float64 against `zinf eval`'s (fp32, CPU).
Run by hand (needs torch and transformers, ~10 GB of RAM, a few minutes):

  python3 tests/model/hf/real_shapes.py [--zinf build/zinf] [--work DIR] [NAME ...]

NAME: qwen3-0.6b (Qwen3-0.6B's shape: head_dim 128 at hidden 1024, q/k norms,
tied), phi4-mini-2l (Phi-4-mini's widths at 2 layers and a 32064 vocabulary:
fused projections, 96 of 128 columns rotated, LongRoPE with 48 factors),
smollm3-4l (SmolLM3-3B's widths at 4 layers, the last without RoPE, GQA 16/4,
a 128256 vocabulary, tied), mistral-2l-window100 (Mistral-7B's widths at 2
layers with a sliding window of 100 keys: blocks of 64 queries whose windows
start and end inside other blocks), gemma3-270m (Gemma 3 270M's shape: 18
layers, every sixth full and the rest sliding with RoPE base 10000, here over
100 keys, not 512; q/k norms and sandwich norms by 1 + w, GeGLU, one key/value
head of 256, a 262144 vocabulary), gemma-2b-2l (Gemma 2B's widths at 2 layers:
GeGLU of 16384, one key/value head of 256, a 256000 vocabulary), gemma3-4b-2l
(Gemma 3 4B's language model at 2 layers, one sliding over 100 keys and one
full with linear RoPE scaling by 8, a 262208 vocabulary), gemma2-2b-2l
(Gemma 2 2B's widths at 2 layers: the first sliding over 100 keys, the
attention's scores softcapped at 50 and the logits at 30, GQA 8/4 of 256, a
256000 vocabulary), granite-2b-2l (Granite 3.3 2B's widths at 2 layers: the
embedding times 12, the scores times 1/64, each branch times 0.22 as it joins
the residual stream, the logits divided by 8, GQA 32/8, a 49159 vocabulary),
olmo2-1b-2l (OLMo 2 1B's widths at 2 layers: norms on the attention's and the
MLP's outputs only, q and k normed over all 16 heads at once, a 100352
vocabulary, untied), olmo3-7b-2l (OLMo 3 7B's widths at 2 layers: OLMo 2's
block, the first layer sliding over 100 keys with the default RoPE, the second
full with YaRN by 8 over 8192 original positions, a 100278 vocabulary),
exaone4-1.2b-4l (EXAONE 4.0 1.2B's widths at 4 layers with 32B's hybrid
attention: three sliding over 100 keys with llama3 RoPE by 16, the fourth full
without RoPE; post norms, q/k norms per head, GQA 32/8 of 64, tied),
helium-2b-2l (Helium 1 2B's widths at 2 layers: RoPE on interleaved pairs,
heads of 128, a 48000 vocabulary, untied), glm4-9b-2l (GLM-4-9B-0414's widths
at 2 layers: interleaved RoPE on half of each head, gate|up fused, q/k/v
biases, norms on the attention's and the MLP's outputs, GQA 32/2, a 151552
vocabulary), ernie4.5-0.3b (ERNIE 4.5 0.3B's shape: 18 layers, interleaved
RoPE, GQA 16/2 of 128, a 103424 vocabulary, tied), qwen3-30b-a3b-1l
(Qwen3-30B-A3B's widths at 1 layer: 128 experts of 768, 8 a token, their
weights renormalized, q/k norms, GQA 32/4 of 128, a 151936 vocabulary),
olmoe-1b-7b-2l (OLMoE-1B-7B's widths at 2 layers: 64 experts of 1024, 8 a
token, the softmax's weights, q and k normed over all 16 heads, a 50304
vocabulary), qwen1.5-moe-a2.7b-1l (Qwen1.5-MoE-A2.7B's widths at 1 layer: 60
experts of 1408, 4 a token, the softmax's weights, a shared expert of 5632
under its sigmoid gate, q/k/v biases, a 151936 vocabulary), glm4.5-air-1l-16e
(GLM-4.5-Air's widths at 1 routed layer with 16 of its 128 experts of 1408,
8 a token, by sigmoid score + a random selection bias, normalized; an
ungated shared expert, q/k/v biases, RoPE on 64 of 128 columns, GQA 96/8, a
151552 vocabulary; fewer experts to fit 24 GB in float64),
ernie4.5-21b-a3b-2l-32e (ERNIE-4.5-21B-A3B's widths at 2 layers with 32 of
its 64 experts of 1536: layer 0 dense of 12288, layer 1 routing 6 a token by
softmax probability + a random selection bias, normalized; two shared
experts, interleaved RoPE, GQA 20/4 of 128, a 103424 vocabulary, tied; 64
experts do not fit 17 GB in float64), dots.llm1-1l-16e (dots.llm1's widths at
1 routed layer with 16 of its 128 experts of 1408: 6 a token by sigmoid score
+ a random selection bias, normalized and times 2.5; two shared experts, q/k
norms, 32 heads of 128, a 152064 vocabulary, untied), deepseek-v3-1l-16e-32k
(DeepSeek-V3's widths at 1 routed layer with 16 of its 256 experts of 2048:
latent attention over 128 heads (q rank 1536, kv rank 512, q/k heads of
128 + 64 rotated in pairs, values of 128), YaRN by 40 over 4096 positions
with its mscale_all_dim; 8 experts a token by sigmoid score + a random
selection bias within 4 of 8 groups, normalized and times 2.5, one shared
expert; untied; the vocabulary cut from 129280 to 32000 and the experts to
16 to fit 17 GB in float64), deepseek-v2-lite-1l (DeepSeek-V2-Lite's widths
at 1 routed layer: latent attention over 16 heads without q's latent (kv
rank 512, q/k heads of 128 + 64 rotated in interleaved pairs, values of
128), YaRN by 40 over 4096 positions with mscale and mscale_all_dim 0.707;
6 of 64 experts of 1408 a token by softmax probability, not renormalized,
two shared experts; a 102400 vocabulary, untied). The models with
experts run transformers' eager experts loop.
Prints one line per model: both losses and their difference.
"""
import argparse
import itertools
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers

B, T = 2, 256


def qwen3():
    return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, attention_bias=False, use_sliding_window=False, max_window_layers=28)


def phi4_mini():
    return transformers.Phi3ForCausalLM, transformers.Phi3Config(
        vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=24,
        num_key_value_heads=8, max_position_embeddings=131072, original_max_position_embeddings=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=None,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                             short_factor=[1.0 + 0.05 * i for i in range(48)],
                             long_factor=[1.0 + 0.4 * i for i in range(48)]))


def smollm3():
    return transformers.SmolLM3ForCausalLM, transformers.SmolLM3Config(
        vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=4, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=65536, rope_theta=5000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, no_rope_layer_interval=4, bos_token_id=128000, eos_token_id=128012,
        pad_token_id=None)


def mistral_window():
    return transformers.MistralForCausalLM, transformers.MistralConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, sliding_window=100)


def gemma3_270m():
    return transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, query_pre_attn_scalar=256,
        sliding_window=100, rms_norm_eps=1e-6, tie_word_embeddings=True)


def gemma_2b():
    return transformers.GemmaForCausalLM, transformers.GemmaConfig(
        vocab_size=256000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=8192, rms_norm_eps=1e-6,
        tie_word_embeddings=True)


def gemma2_2b():
    return transformers.Gemma2ForCausalLM, transformers.Gemma2Config(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, max_position_embeddings=8192, query_pre_attn_scalar=256,
        sliding_window=100, rms_norm_eps=1e-6, tie_word_embeddings=True, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0)


def granite_2b():
    return transformers.GraniteForCausalLM, transformers.GraniteConfig(
        vocab_size=49159, hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, rope_theta=10000000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, embedding_multiplier=12.0, attention_multiplier=0.015625,
        residual_multiplier=0.22, logits_scaling=8.0)


def olmo2_1b():
    return transformers.Olmo2ForCausalLM, transformers.Olmo2Config(
        vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=16,
        num_key_value_heads=16, max_position_embeddings=4096, rope_theta=500000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, pad_token_id=100277, bos_token_id=None, eos_token_id=100257)


def olmo3_7b():
    return transformers.Olmo3ForCausalLM, transformers.Olmo3Config(
        vocab_size=100278, hidden_size=4096, intermediate_size=11008, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=65536, rms_norm_eps=1e-6, tie_word_embeddings=False,
        pad_token_id=100277, bos_token_id=None, eos_token_id=100257, sliding_window=100,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": dict(rope_type="yarn", rope_theta=500000.0, factor=8.0,
                                                original_max_position_embeddings=8192,
                                                attention_factor=1.2079441541679836, beta_fast=32, beta_slow=1),
                         "sliding_attention": dict(rope_type="default", rope_theta=500000.0)})


def exaone4_1b():
    return transformers.Exaone4ForCausalLM, transformers.Exaone4Config(
        vocab_size=102400, hidden_size=2048, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=65536, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=361, pad_token_id=0, sliding_window=100,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        rope_parameters=dict(rope_type="llama3", rope_theta=1000000.0, factor=16.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=8192))


def helium_2b():
    return transformers.HeliumForCausalLM, transformers.HeliumConfig(
        vocab_size=48000, hidden_size=2560, intermediate_size=7040, num_hidden_layers=2, num_attention_heads=20,
        num_key_value_heads=20, head_dim=128, max_position_embeddings=4096, rms_norm_eps=1e-8,
        tie_word_embeddings=False, pad_token_id=3, bos_token_id=1, eos_token_id=2, attention_bias=False,
        rope_parameters=dict(rope_type="default", rope_theta=100000.0))


def glm4_9b():
    return transformers.Glm4ForCausalLM, transformers.Glm4Config(
        vocab_size=151552, hidden_size=4096, intermediate_size=13696, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=2, head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-5,
        tie_word_embeddings=False, pad_token_id=151329, eos_token_id=[151329, 151336, 151338], attention_bias=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5))


def ernie45_03b():
    return transformers.Ernie4_5ForCausalLM, transformers.Ernie4_5Config(
        vocab_size=103424, hidden_size=1024, intermediate_size=3072, num_hidden_layers=18, num_attention_heads=16,
        num_key_value_heads=2, head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2, use_bias=False,
        rope_parameters=dict(rope_type="default", rope_theta=500000.0))


def qwen3_moe_30b():
    return transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=1,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))


def olmoe_1b_7b():
    return transformers.OlmoeForCausalLM, transformers.OlmoeConfig(
        vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=16,
        num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
        max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=1,
        eos_token_id=50279, rope_parameters=dict(rope_type="default", rope_theta=10000.0))


def qwen15_moe_a27b():
    return transformers.Qwen2MoeForCausalLM, transformers.Qwen2MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=16,
        num_experts=60, num_experts_per_tok=4, norm_topk_prob=False, max_position_embeddings=8192, rms_norm_eps=1e-6,
        tie_word_embeddings=False, use_sliding_window=False, rope_parameters=dict(rope_type="default",
                                                                                  rope_theta=1000000.0))


def glm45_air():
    return transformers.Glm4MoeForCausalLM, transformers.Glm4MoeConfig(
        vocab_size=151552, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=1,
        num_attention_heads=96, num_key_value_heads=8, head_dim=128, n_routed_experts=16, num_experts_per_tok=8,
        n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
        first_k_dense_replace=0, attention_bias=True, use_qk_norm=False, partial_rotary_factor=0.5,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, num_nextn_predict_layers=0,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.5))


def ernie45_21b():
    return transformers.Ernie4_5_MoeForCausalLM, transformers.Ernie4_5_MoeConfig(
        vocab_size=103424, hidden_size=2560, intermediate_size=12288, moe_intermediate_size=1536, num_hidden_layers=2,
        num_attention_heads=20, num_key_value_heads=4, moe_num_experts=32, moe_k=6, moe_num_shared_experts=2,
        moe_layer_start_index=1, moe_layer_interval=1, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=True, use_bias=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters=dict(rope_type="default", rope_theta=500000.0))


def dots1():
    return transformers.Dots1ForCausalLM, transformers.Dots1Config(
        vocab_size=152064, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=1,
        num_attention_heads=32, num_key_value_heads=32, n_routed_experts=16, num_experts_per_tok=6,
        n_shared_experts=2, n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        first_k_dense_replace=0, max_position_embeddings=32768, rms_norm_eps=1e-5, tie_word_embeddings=False,
        sliding_window=None, rope_parameters=dict(rope_type="default", rope_theta=10000000.0))


def deepseek_v3():
    return transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config(
        vocab_size=32000, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=1,
        num_attention_heads=128, num_key_value_heads=128, n_routed_experts=16, num_experts_per_tok=8,
        n_shared_experts=1, n_group=8, topk_group=4, routed_scaling_factor=2.5, norm_topk_prob=True,
        first_k_dense_replace=0, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, rope_interleave=True, max_position_embeddings=163840, rms_norm_eps=1e-6,
        tie_word_embeddings=False, num_nextn_predict_layers=0,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                             mscale=1.0, mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0))


def deepseek_v2_lite():
    return transformers.DeepseekV2ForCausalLM, transformers.DeepseekV2Config(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=1,
        num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64, num_experts_per_tok=6,
        n_shared_experts=2, topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0,
        norm_topk_prob=False, first_k_dense_replace=0, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
        qk_nope_head_dim=128, v_head_dim=128, max_position_embeddings=163840, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                             mscale=0.707, mscale_all_dim=0.707, beta_fast=32.0, beta_slow=1.0))


def gemma3_4b():
    return transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
        vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, max_position_embeddings=131072, query_pre_attn_scalar=256,
        sliding_window=100, sliding_window_pattern=2, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
                         "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})


SHAPES = {"qwen3-0.6b": qwen3, "phi4-mini-2l": phi4_mini, "smollm3-4l": smollm3, "mistral-2l-window100": mistral_window,
          "gemma3-270m": gemma3_270m, "gemma-2b-2l": gemma_2b, "gemma3-4b-2l": gemma3_4b,
          "gemma2-2b-2l": gemma2_2b, "granite-2b-2l": granite_2b, "olmo2-1b-2l": olmo2_1b,
          "olmo3-7b-2l": olmo3_7b, "exaone4-1.2b-4l": exaone4_1b,
          "helium-2b-2l": helium_2b, "glm4-9b-2l": glm4_9b, "ernie4.5-0.3b": ernie45_03b,
          "qwen3-30b-a3b-1l": qwen3_moe_30b, "olmoe-1b-7b-2l": olmoe_1b_7b,
          "qwen1.5-moe-a2.7b-1l": qwen15_moe_a27b, "glm4.5-air-1l-16e": glm45_air,
          "ernie4.5-21b-a3b-2l-32e": ernie45_21b, "dots.llm1-1l-16e": dots1,
          "deepseek-v3-1l-16e-32k": deepseek_v3, "deepseek-v2-lite-1l": deepseek_v2_lite}


def check(name, zinf, work):
    model_cls, config = SHAPES[name]()
    config.architectures = [model_cls.__name__]
    folder = os.path.join(work, name)
    if not os.path.exists(os.path.join(folder, "config.json")):
        torch.manual_seed(0)
        model = model_cls(config)
        # A router's selection bias (GLM's buffer, ERNIE's untrained parameter): not all zeros.
        for key, t in itertools.chain(model.named_buffers(), model.named_parameters()):
            if key.endswith("e_score_correction_bias"):
                with torch.no_grad():
                    t.copy_(0.02 * torch.randn(t.shape))
        model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
        del model
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, config.vocab_size, size=B * T + 1, dtype=np.uint32)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 2, tokens.size)  # zinf's token file, version 2 (uint32)
    token_file = os.path.join(work, name + "-tokens.bin")
    with open(token_file, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    # The experts' loop as written (the default grouped matmul has no float64).
    experts = {"experts_implementation": "eager"} if hasattr(config, "num_experts_per_tok") else {}
    model = model_cls.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager", **experts)
    t = torch.from_numpy(tokens.astype(np.int64))
    with torch.no_grad():
        logits = model(input_ids=t[:-1].view(B, T)).logits
        want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[1:].view(-1)).item()
    del model, logits
    out = subprocess.run([zinf, "eval", "--model", folder, "--data", token_file, "--batch", str(B), "--seq-len", str(T),
                          "--quiet"], check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_WAIT_POLICY="passive")).stdout
    got = float(next(line.split()[1] for line in out.splitlines() if line.startswith("loss ")))
    print(f"{name}: transformers float64 {want:.9f}  zinf {got:.9f}  difference {got - want:.2e}")
    return abs(got - want) <= 1e-5 * max(1.0, abs(want))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zinf", default="build/zinf")
    p.add_argument("--work", default="/tmp/zinf-real-shapes")
    p.add_argument("names", nargs="*", metavar="NAME")
    a = p.parse_args()
    unknown = set(a.names) - set(SHAPES)
    if unknown:
        p.error("unknown shape(s): " + ", ".join(sorted(unknown)) + " (known: " + ", ".join(SHAPES) + ")")
    os.makedirs(a.work, exist_ok=True)
    ok = all([check(n, a.zinf, a.work) for n in (a.names or SHAPES)])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
