#!/usr/bin/env python3
"""Makes the HF parity fixtures of tests/model/hf_parity_test.cc.

Run by hand (needs pip-installed torch and transformers; CI only reads the
committed output):  python3 tests/model/hf/make_fixtures.py [NAME ...]
(every architecture, or only the named ones: each has its own seed, so one
can be added without remaking the others)

For each architecture a tiny random-init checkpoint folder <name>/ (config.json
+ model.safetensors, as save_pretrained writes them) and <name>/reference.safetensors:
  tokens   I32 [B*T+1]   the fixed batch: inputs tokens[:-1], targets tokens[1:], as B rows of T
  logits   F64 [B*T, V]  transformers' logits on the inputs (float64, eager attention)
  loss     F64 [1]       mean cross-entropy over the B*T positions (float64)
  curve    F64 [30]      the loss before each of 30 torch.optim.AdamW steps on that batch (fp32)
Norm weights and biases are perturbed away from 1 and 0 so that a swapped or
dropped tensor changes the numbers. The bf16 checkpoint's references are
computed from its bf16 weights (upcast to fp32).
"""
import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
B, T = 2, 16
ADAM = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
STEPS = 30

COMMON_LLAMA = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=T, rms_norm_eps=1e-5, attention_dropout=0.0)

MODELS = {
    # tied head, fp32, GELU, learned positions, fused c_attn (Conv1D)
    "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel,
             dict(vocab_size=100, bos_token_id=0, eos_token_id=0, n_positions=T, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                  embd_pdrop=0.0, attn_pdrop=0.0), torch.float32),
    # untied head, GQA, llama3 rope scaling, theta 500000
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(COMMON_LLAMA, vocab_size=200, tie_word_embeddings=False, rope_theta=500000.0,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=8)), torch.float32),
    # q/k/v biases, tied head, bf16 checkpoint
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(COMMON_LLAMA, vocab_size=150, tie_word_embeddings=True, use_sliding_window=False),
              torch.bfloat16),
    # a sliding window longer than the sequence, f16 checkpoint
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(COMMON_LLAMA, vocab_size=120, tie_word_embeddings=False, sliding_window=32), torch.float16),
    # q_norm/k_norm, heads wider than hidden_size / heads (head_dim 16, not 8), untied head
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(COMMON_LLAMA, vocab_size=130, head_dim=16, tie_word_embeddings=False, use_sliding_window=False),
              torch.float32),
    # q|k|v in one qkv_proj, gate|up in one gate_up_proj, a sliding window longer than the sequence
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM,
             dict(COMMON_LLAMA, vocab_size=110, tie_word_embeddings=False, sliding_window=24, resid_pdrop=0.0,
                  embd_pdrop=0.0, original_max_position_embeddings=T, bos_token_id=0, eos_token_id=0,
                  pad_token_id=None), torch.float32),
    # Phi-4-mini's rotary embedding: LongRoPE (the long factors: the sequence is past the original 8
    # positions; cos and sin scaled by sqrt(1 + ln 2 / ln 8)) on 6 of each head's 8 columns
    "phi3-longrope": (transformers.Phi3Config, transformers.Phi3ForCausalLM,
                      dict(COMMON_LLAMA, vocab_size=90, tie_word_embeddings=True, resid_pdrop=0.0, embd_pdrop=0.0,
                           original_max_position_embeddings=8, bos_token_id=0, eos_token_id=0, pad_token_id=None,
                           rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                                                short_factor=[1.0, 1.5, 2.0], long_factor=[2.0, 3.0, 5.0])),
                      torch.float32),
    # NoPE layers: no rotary embedding in layers 1 and 3 (SmolLM3's no_rope_layers), tied head, bf16 checkpoint
    "smollm3": (transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM,
                dict(COMMON_LLAMA, num_hidden_layers=4, vocab_size=140, tie_word_embeddings=True,
                     no_rope_layer_interval=2, rope_theta=2000000.0, bos_token_id=0, eos_token_id=0,
                     pad_token_id=None), torch.bfloat16),
    # a sliding window shorter than the sequence: each query sees itself and the 4 keys before it
    "mistral-window": (transformers.MistralConfig, transformers.MistralForCausalLM,
                       dict(COMMON_LLAMA, vocab_size=100, tie_word_embeddings=False, sliding_window=5),
                       torch.float32),
    # windows in some layers only: layers from max_window_layers (2 of 3) on slide, over 3 keys
    "qwen2-window": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                     dict(COMMON_LLAMA, num_hidden_layers=3, vocab_size=90, tie_word_embeddings=True,
                          use_sliding_window=True, sliding_window=3, max_window_layers=2), torch.float32),
    # Gemma: norms by 1 + w, GeGLU, the embedding scaled by sqrt(32), one key/value head of 16 (not 32 / 4),
    # tied head, bf16 checkpoint (pad_token_id None: transformers' embedding would freeze a padding row)
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM,
              dict(COMMON_LLAMA, vocab_size=100, num_key_value_heads=1, head_dim=16, pad_token_id=None),
              torch.bfloat16),
    # Gemma 3: q/k norms and sandwich norms (all by 1 + w), layers 0 and 2 sliding over 5 keys with RoPE base
    # 10000, layer 1 full with base 1e6 and linear scaling by 4, scores scaled by 24^-1/2 (not 16^-1/2)
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
               dict(COMMON_LLAMA, num_hidden_layers=3, vocab_size=110, head_dim=16, sliding_window=5,
                    sliding_window_pattern=2, query_pre_attn_scalar=24, pad_token_id=None,
                    rope_parameters={"full_attention": dict(rope_type="linear", factor=4.0, rope_theta=1000000.0),
                                     "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}),
               torch.float32),
    # Gemma 3 4B and up: the language model (text_config, tensors under language_model.model.) beside a vision
    # tower and projector (tiny SigLIP) that zinf leaves alone; text in, text out
    "gemma3-mm": (transformers.Gemma3Config, transformers.Gemma3ForConditionalGeneration,
                  dict(text_config=dict(COMMON_LLAMA, num_hidden_layers=2, vocab_size=120, head_dim=16,
                                        sliding_window=6, sliding_window_pattern=2, pad_token_id=None),
                       vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, image_size=28, patch_size=14),
                       mm_tokens_per_image=4, image_token_index=117, boi_token_index=118, eoi_token_index=119),
                  torch.bfloat16),
    # pad_token_id 3 at every fourth position: transformers' embedding (padding_idx) gives its row no gradient
    # from the input side; the tied head still trains it
    "llama-pad": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                  dict(COMMON_LLAMA, vocab_size=100, tie_word_embeddings=True, pad_token_id=3), torch.float32),
    # Gemma 2: sandwich norms (by 1 + w), layers 0 and 2 sliding over 5 keys, scores scaled by 24^-1/2, and
    # softcaps small enough to bite: the attention's scores capped at 0.3, the logits at 0.8
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
               dict(COMMON_LLAMA, num_hidden_layers=3, vocab_size=100, head_dim=16, sliding_window=5,
                    query_pre_attn_scalar=24, attn_logit_softcapping=0.3, final_logit_softcapping=0.8,
                    pad_token_id=None),
               torch.float32),
    # Granite: the embedding times 3, each branch times 0.5 as it joins the residual stream, the scores times 0.2
    # (not 8^-1/2), the logits divided by 2.5; tied head
    "granite": (transformers.GraniteConfig, transformers.GraniteForCausalLM,
                dict(COMMON_LLAMA, vocab_size=100, tie_word_embeddings=True, embedding_multiplier=3.0,
                     attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=2.5), torch.float32),
    # OLMo 2: no norms before the attention and the MLP, one on each's output; q and k normed over all their heads
    # (weights [32] and [16]); untied head, bf16 checkpoint
    "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM,
              dict(COMMON_LLAMA, vocab_size=110, tie_word_embeddings=False, pad_token_id=None, eos_token_id=0,
                   rope_theta=500000.0),
              torch.bfloat16),
    # YaRN: base 100 over an original 64 positions, factor 4: of each head's 8 frequencies the first kept, the
    # next four ramped (truncate false: the ramp's bounds not rounded), the last three divided by 4; cos and sin
    # times 0.1 ln 4 + 1
    "qwen3-yarn": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                   dict(COMMON_LLAMA, vocab_size=120, head_dim=16, tie_word_embeddings=True, use_sliding_window=False,
                        rope_parameters=dict(rope_type="yarn", rope_theta=100.0, factor=4.0,
                                             original_max_position_embeddings=64, truncate=False)),
                   torch.float32),
    # OLMo 3: OLMo 2's block, layer 0 sliding over 5 keys with a default RoPE of base 1000, layer 1 full with
    # YaRN (base 50, factor 2, betas 8 and 1 over 32 positions, attention_factor 1.2); untied head, bf16
    "olmo3": (transformers.Olmo3Config, transformers.Olmo3ForCausalLM,
              dict(COMMON_LLAMA, vocab_size=100, tie_word_embeddings=False, pad_token_id=None, eos_token_id=0,
                   sliding_window=5, layer_types=["sliding_attention", "full_attention"],
                   rope_parameters={"full_attention": dict(rope_type="yarn", rope_theta=50.0, factor=2.0,
                                                           attention_factor=1.2, beta_fast=8, beta_slow=1,
                                                           original_max_position_embeddings=32),
                                    "sliding_attention": dict(rope_type="default", rope_theta=1000.0)}),
              torch.bfloat16),
    # EXAONE 4: OLMo 2's post norms with q/k norms per head (Qwen3's); layer 0 sliding over 5 keys with llama3
    # RoPE, layer 1 full without RoPE (its hybrid attention's NoPE layers); untied head
    "exaone4": (transformers.Exaone4Config, transformers.Exaone4ForCausalLM,
                dict(COMMON_LLAMA, vocab_size=110, tie_word_embeddings=False, sliding_window=5,
                     sliding_window_pattern=2,
                     rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=2.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=8)),
                torch.float32),
    # Seed-OSS: q/k/v biases from attention_bias (o_proj none), heads of 16 (its head_dim key), untied head
    "seed-oss": (transformers.SeedOssConfig, transformers.SeedOssForCausalLM,
                 dict(COMMON_LLAMA, vocab_size=100, head_dim=16, attention_bias=True, attention_out_bias=False,
                      residual_dropout=0.0, tie_word_embeddings=False, pad_token_id=None), torch.float32),
    # Helium: Llama's block with q/k/v biases from attention_bias, heads of 8 (its head_dim key), tied head, bf16
    "helium": (transformers.HeliumConfig, transformers.HeliumForCausalLM,
               dict(COMMON_LLAMA, vocab_size=100, head_dim=8, attention_bias=True, tie_word_embeddings=True,
                    pad_token_id=None), torch.bfloat16),
    # GLM: RoPE on interleaved pairs over the first half of each head (8 of 16), gate|up fused as gate_up_proj,
    # q/k/v biases (attention_bias), untied head
    "glm": (transformers.GlmConfig, transformers.GlmForCausalLM,
            dict(COMMON_LLAMA, vocab_size=100, head_dim=16, attention_bias=True, tie_word_embeddings=False,
                 pad_token_id=None), torch.float32),
    # GLM-4: GLM's layer with norms on the attention's and the MLP's outputs (post_self_attn_layernorm,
    # post_mlp_layernorm), 6 of 8 columns turned, no biases, tied head, bf16
    "glm4": (transformers.Glm4Config, transformers.Glm4ForCausalLM,
             dict(COMMON_LLAMA, vocab_size=110, head_dim=8, partial_rotary_factor=0.75, attention_bias=False,
                  tie_word_embeddings=True, pad_token_id=None), torch.bfloat16),
    # ERNIE 4.5: Llama's layer with RoPE on interleaved pairs, heads of 16, tied head (its default)
    "ernie4_5": (transformers.Ernie4_5Config, transformers.Ernie4_5ForCausalLM,
                 dict(COMMON_LLAMA, vocab_size=100, head_dim=16, pad_token_id=None), torch.float32),
    # Qwen3-MoE: Qwen3's attention, every MLP routed: 4 experts of width 24 (moe_intermediate_size), 2 a token,
    # their weights renormalized (norm_topk_prob), untied head
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  dict(COMMON_LLAMA, vocab_size=100, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                       norm_topk_prob=True, tie_word_embeddings=False, pad_token_id=None), torch.float32),
    # Mixtral: Mistral's attention, 4 experts (w1, w3, w2 under block_sparse_moe) of width 24, 2 a token, always
    # renormalized, bf16
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                dict(COMMON_LLAMA, vocab_size=100, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                     sliding_window=None, pad_token_id=None), torch.bfloat16),
    # OLMoE: q/k norms over all heads, 4 experts of width 24 (intermediate_size), 2 a token, the softmax's weights
    # as they are (norm_topk_prob false), its padding token 1
    "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM,
              dict(COMMON_LLAMA, vocab_size=100, intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                   norm_topk_prob=False, pad_token_id=1, eos_token_id=None), torch.float32),
    # Qwen3-MoE with the routers' load-balancing loss in the loss (output_router_logits, a coefficient large
    # enough to move the curve)
    "qwen3_moe-aux": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                      dict(COMMON_LLAMA, vocab_size=100, num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=24, norm_topk_prob=True, tie_word_embeddings=False, pad_token_id=None,
                           output_router_logits=True, router_aux_loss_coef=0.2), torch.float32),
    # Qwen2-MoE: q/k/v biases, 4 routed experts of width 24, 2 a token, the softmax's weights as they are, and a
    # shared expert of width 40 under its sigmoid gate; three layers, use_sliding_window with max_window_layers 2:
    # layer 0 slides (window 5), 1 and 2 do not; untied head
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                  dict(COMMON_LLAMA, num_hidden_layers=3, vocab_size=100, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=24, shared_expert_intermediate_size=40, norm_topk_prob=False,
                       use_sliding_window=True, sliding_window=5, max_window_layers=2, tie_word_embeddings=False,
                       pad_token_id=None), torch.float32),
    # Qwen3-MoE with dense layers among the routed ones: of four layers 0 and 2 dense (mlp_only_layers; 7 is past
    # the model), a gated MLP of 40 (intermediate_size); 1 and 3 routed; the load-balancing loss over the two
    # routed layers in the loss
    "qwen3_moe-dense": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                        dict(COMMON_LLAMA, num_hidden_layers=4, intermediate_size=40, vocab_size=100, num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True,
                             mlp_only_layers=[0, 2, 7], tie_word_embeddings=False, pad_token_id=None,
                             output_router_logits=True, router_aux_loss_coef=0.2), torch.float32),
    # GLM-4.5 (Glm4Moe): a sigmoid router choosing by score + e_score_correction_bias (random here) among 8
    # experts of width 24 in 4 groups of which 2 are candidates, 3 a token, the weights normalized and times 2.5;
    # a shared expert of width 24 (ungated); layer 0 dense (first_k_dense_replace, width 40), 1 and 2 routed;
    # q/k/v biases, q/k norms, RoPE over the first half of each head (rotate-half); untied head; the checkpoint
    # carries a multi-token-prediction layer's tensors (layers.3), which the model does not read
    "glm4_moe": (transformers.Glm4MoeConfig, transformers.Glm4MoeForCausalLM,
                 dict(COMMON_LLAMA, num_hidden_layers=3, intermediate_size=40, vocab_size=100, n_routed_experts=8,
                      num_experts_per_tok=3, n_group=4, topk_group=2, moe_intermediate_size=24, n_shared_experts=1,
                      routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1, attention_bias=True,
                      use_qk_norm=True, partial_rotary_factor=0.5, tie_word_embeddings=False, pad_token_id=None,
                      num_nextn_predict_layers=1), torch.float32),
    # ERNIE 4.5 MoE: a softmax router choosing 3 of 8 experts of width 24 by probability + e_score_correction_bias
    # (random here; mlp.moe_statics, stored [1, 8]), their weights divided by their sum or by moe_norm_min 0.5 where
    # the sum is smaller (both happen); two shared experts (one ungated MLP of 48); of four layers 1 and 2 routed
    # (moe_layer_start_index 1, moe_layer_end_index 2), 0 and 3 dense (width 40); interleaved RoPE, GQA, tied head,
    # padding token 0; the checkpoint carries a multi-token-prediction module's tensors (model.mtp_*) and the
    # Hub's keys transformers does not read
    "ernie4_5_moe": (transformers.Ernie4_5_MoeConfig, transformers.Ernie4_5_MoeForCausalLM,
                     dict(COMMON_LLAMA, num_hidden_layers=4, intermediate_size=40, vocab_size=100, moe_num_experts=8,
                          moe_k=3, moe_intermediate_size=24, moe_num_shared_experts=2, moe_layer_start_index=1,
                          moe_layer_end_index=2, moe_norm_min=0.5), torch.float32),
    # dots.llm1 (Dots1): GLM-4.5's router (sigmoid score + a random e_score_correction_bias, 2 groups of 4 experts
    # of which 1 is a candidate, 3 a token, normalized, times 2) with two shared experts (one ungated MLP of 48);
    # layer 0 dense (first_k_dense_replace); Qwen3's q/k norms; layer 2 slides over 5 keys (from
    # max_window_layers 2, with no use_sliding_window); untied head; bf16 checkpoint, the router and its bias in
    # fp32 (as transformers keeps them)
    "dots1": (transformers.Dots1Config, transformers.Dots1ForCausalLM,
              dict(COMMON_LLAMA, num_hidden_layers=3, intermediate_size=40, vocab_size=100, n_routed_experts=8,
                   num_experts_per_tok=3, n_group=2, topk_group=1, moe_intermediate_size=24, n_shared_experts=2,
                   routed_scaling_factor=2.0, norm_topk_prob=True, first_k_dense_replace=1, sliding_window=5,
                   max_window_layers=2, tie_word_embeddings=False, pad_token_id=None), torch.bfloat16),
    # DeepSeek-V3 (DeepseekV3): latent attention (q through a latent of 10 and its norm, k and v out of one of 12
    # and its norm; heads of 6 + 4 q/k columns, the 4 rotated in interleaved pairs, k's shared by the heads;
    # values of 5), YaRN (factor 4 over 8 original positions) whose mscale_all_dim 0.8 scales the scores and,
    # against mscale 1, the rotations; GLM-4.5's router (8 experts in 4 groups, 2 candidates, 3 a token, random
    # selection bias, times 2.5) and one shared expert; layer 0 dense; the checkpoint carries a
    # multi-token-prediction layer's tensors (layers.3) and the Hub's original keys
    "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM,
                    dict(COMMON_LLAMA, num_hidden_layers=3, num_key_value_heads=4, intermediate_size=40,
                         vocab_size=100, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
                         moe_intermediate_size=24, n_shared_experts=1, routed_scaling_factor=2.5,
                         first_k_dense_replace=1, kv_lora_rank=12, q_lora_rank=10, qk_rope_head_dim=4,
                         qk_nope_head_dim=6, v_head_dim=5, rope_interleave=True,
                         rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                              original_max_position_embeddings=8, mscale=1.0, mscale_all_dim=0.8,
                                              beta_fast=32.0, beta_slow=1.0),
                         tie_word_embeddings=False, pad_token_id=None, num_nextn_predict_layers=1),
                    torch.float32),
    # DeepSeek-V3's attention without q's latent (q_proj; q_lora_rank null, as DeepSeek-V2-Lite's), rotate-half
    # RoPE (rope_interleave false) of plain frequencies, values as wide as the q/k heads; two routed layers; bf16
    # checkpoint, the router and its bias in fp32
    "deepseek_v3-q": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM,
                      dict(COMMON_LLAMA, num_hidden_layers=2, num_key_value_heads=4, intermediate_size=40,
                           vocab_size=100, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                           moe_intermediate_size=24, n_shared_experts=2, routed_scaling_factor=1.5,
                           first_k_dense_replace=0, kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=6,
                           qk_nope_head_dim=4, v_head_dim=10, rope_interleave=False, tie_word_embeddings=False,
                           pad_token_id=None, num_nextn_predict_layers=0), torch.bfloat16),
    # DeepSeek-V2 (DeepseekV2): V3's latent attention (q through a latent of 10, k and v out of one of 12, heads of
    # 6 + 4 q/k columns, RoPE always on interleaved pairs, values of 5) with V2-Lite's YaRN (mscale and
    # mscale_all_dim 0.707), and its softmax router: topk_method group_limited_greedy chooses 3 of 8 experts within
    # the 2 of 4 groups whose most probable expert is highest, weighted by their probabilities (not renormalized)
    # times 1.5; two shared experts; layer 0 dense; the Hub's original keys
    "deepseek_v2": (transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM,
                    dict(COMMON_LLAMA, num_hidden_layers=3, num_key_value_heads=4, intermediate_size=40,
                         vocab_size=100, n_routed_experts=8, num_experts_per_tok=3, topk_method="group_limited_greedy",
                         n_group=4, topk_group=2, moe_intermediate_size=24, n_shared_experts=2,
                         routed_scaling_factor=1.5, norm_topk_prob=False, first_k_dense_replace=1, kv_lora_rank=12,
                         q_lora_rank=10, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5,
                         rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                              original_max_position_embeddings=8, mscale=0.707,
                                              mscale_all_dim=0.707, beta_fast=32.0, beta_slow=1.0),
                         tie_word_embeddings=False, pad_token_id=None), torch.float32),
    # DeepSeek-V2-Lite's form: q_proj (q_lora_rank null), the greedy router (the 2 most probable of 4 experts; its
    # n_group and topk_group of 1 not read), one shared expert, every layer routed; bf16 checkpoint, the router in
    # fp32 (as transformers keeps it)
    "deepseek_v2-lite": (transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM,
                         dict(COMMON_LLAMA, num_hidden_layers=2, num_key_value_heads=4, intermediate_size=40,
                              vocab_size=100, n_routed_experts=4, num_experts_per_tok=2, topk_method="greedy",
                              n_group=1, topk_group=1, moe_intermediate_size=24, n_shared_experts=1,
                              routed_scaling_factor=1.0, first_k_dense_replace=0, kv_lora_rank=8, q_lora_rank=None,
                              qk_rope_head_dim=6, qk_nope_head_dim=4, v_head_dim=10, tie_word_embeddings=False,
                              pad_token_id=None), torch.bfloat16),
}

# Tensors a fixture's checkpoint carries beyond the model's (GLM-4.5's multi-token-prediction layer, ERNIE 4.5's
# module: a few of their names and shapes), to show they are kept aside, not read.
EXTRA_TENSORS = {
    "glm4_moe": {"model.layers.3.eh_proj.weight": (32, 64), "model.layers.3.enorm.weight": (32,),
                 "model.layers.3.mlp.experts.0.gate_proj.weight": (24, 32),
                 "model.layers.3.shared_head.norm.weight": (32,)},
    "deepseek_v3": {"model.layers.3.eh_proj.weight": (32, 64), "model.layers.3.enorm.weight": (32,),
                    "model.layers.3.self_attn.kv_b_proj.weight": (44, 12),
                    "model.layers.3.shared_head.head.weight": (100, 32)},
    "ernie4_5_moe": {"model.mtp_block.0.input_layernorm.weight": (32,),
                     "model.mtp_block.0.mlp.experts.0.gate_proj.weight": (24, 32),
                     "model.mtp_emb_norm.0.weight": (32,), "model.mtp_hidden_norm.0.weight": (32,),
                     "model.mtp_linear_proj.0.weight": (32, 64)},
}

# Keys a fixture's config.json carries beyond what save_pretrained writes (ERNIE 4.5's Hub configs: the original
# code's keys, which transformers does not read).
EXTRA_CONFIG = {
    "deepseek_v2": {"scoring_func": "softmax", "moe_layer_freq": 1, "ep_size": 1, "aux_loss_alpha": 0.001,
                    "seq_aux": True},
    "deepseek_v3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1, "ep_size": 1,
                    "aux_loss_alpha": 0.001, "seq_aux": True},
    "ernie4_5_moe": {"num_nextn_predict_layers": 1, "moe_capacity": [8, 8, 8], "moe_gate": "topk",
                     "moe_use_aux_free": True, "multi_token_pred_lambda": 0.3, "use_rmsnorm": True},
}


def perturb(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a router's selection bias (a buffer: saved, not trained)
                buf.copy_(0.1 * torch.randn(buf.shape, generator=gen))


def as_stored(model, dtype):
    """The model in `dtype` as transformers stores it: the tensors its class keeps in fp32 (a router with a selection
    bias and its bias: _keep_in_fp32_modules_strict) stay fp32, the rest is cast."""
    keep = getattr(model, "_keep_in_fp32_modules_strict", None) or []
    tensors = lambda: itertools.chain(model.named_parameters(), model.named_buffers())
    fp32 = {n: t.detach().clone() for n, t in tensors() if any(k in n for k in keep)}
    model = model.to(dtype)
    with torch.no_grad():
        for n, t in tensors():
            if n in fp32:
                t.data = fp32[n]
    return model


def loss_of(model, inputs, targets):
    out = model(input_ids=inputs)
    logits = out.logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    if getattr(out, "aux_loss", None) is not None:  # output_router_logits: as the model's own loss adds it
        loss = loss + model.config.router_aux_loss_coef * out.aux_loss
    return logits, loss


def make(name, config_cls, model_cls, kwargs, dtype, seed):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    config = config_cls(**kwargs)
    config._attn_implementation = "eager"
    model = model_cls(config).float()
    perturb(model, gen)
    if dtype != torch.float32:  # the reference uses the stored (rounded) weights
        model = as_stored(model, dtype).float()
    out = os.path.join(HERE, name)
    os.makedirs(out, exist_ok=True)
    as_stored(model, dtype).save_pretrained(out, safe_serialization=True)
    os.remove(os.path.join(out, "generation_config.json"))  # not read by zinf
    if name in EXTRA_CONFIG:
        path = os.path.join(out, "config.json")
        with open(path) as f:
            saved = json.load(f)
        saved.update(EXTRA_CONFIG[name])
        with open(path, "w") as f:
            json.dump(saved, f, indent=2, sort_keys=True)
            f.write("\n")
    if name in EXTRA_TENSORS:
        path = os.path.join(out, "model.safetensors")
        stored = load_file(path)
        for key, shape in EXTRA_TENSORS[name].items():
            stored[key] = (0.05 * torch.randn(shape, generator=gen)).to(dtype)
        save_file(stored, path, metadata={"format": "pt"})
    model = model.float()
    model.config._attn_implementation = "eager"
    v = config.get_text_config().vocab_size
    tokens = torch.randint(0, v, (B * T + 1,), generator=gen)
    pad = config.get_text_config().pad_token_id
    if pad is not None:
        tokens[::4] = pad
    inputs, targets = tokens[:-1].view(B, T), tokens[1:].view(B, T)
    # The logits and loss in float64: transformers' own fp32 run is off the
    # exact values by up to ~1e-4 here, more than the 1e-5 zinf must meet.
    # The experts' loop as written (the default grouped matmul has no float64).
    experts = {"experts_implementation": "eager"} if hasattr(config, "num_experts_per_tok") else {}
    exact = model_cls.from_pretrained(out, attn_implementation="eager", dtype=torch.float64, **experts)
    exact.eval()
    with torch.no_grad():
        logits, loss = loss_of(exact, inputs, targets)
    # The curve from the folder as saved: a model cast to bf16 and back in
    # memory would also have rounded its buffers (Gemma's embedding scale).
    model = model_cls.from_pretrained(out, attn_implementation="eager", dtype=torch.float32, **experts)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), **ADAM)
    curve = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, l = loss_of(model, inputs, targets)
        curve.append(l.item())
        l.backward()
        opt.step()
    save_file({"tokens": tokens.to(torch.int32), "logits": logits.reshape(B * T, v).contiguous(),
               "loss": torch.tensor([loss.item()], dtype=torch.float64),
               "curve": torch.tensor(curve, dtype=torch.float64)},
              os.path.join(out, "reference.safetensors"),
              metadata={"adamw": json.dumps(ADAM), "batch": str(B), "seq_len": str(T),
                        "transformers": transformers.__version__, "torch": torch.__version__})
    print(name, "loss", loss.item(), "curve", curve[0], "->", curve[-1])


def main():
    only = set(sys.argv[1:])
    unknown = only - set(MODELS)
    if unknown:
        sys.exit("unknown fixture(s): " + ", ".join(sorted(unknown)) + " (known: " + ", ".join(MODELS) + ")")
    for i, (name, (config_cls, model_cls, kwargs, dtype)) in enumerate(MODELS.items()):
        if not only or name in only:
            make(name, config_cls, model_cls, kwargs, dtype, seed=1000 + i)


if __name__ == "__main__":
    main()
