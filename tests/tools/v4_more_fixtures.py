# More V4 oracle fixtures (other shapes, seeds, ragged FP8 blocks, longer sequences) with the
# generator tests/tools/v4_fixtures.py. Run on the GPU machine (it has transformers 5.17):
#   V4_FIXTURES_DIR=path/to/oracle python3 v4_more_fixtures.py OUTDIR
# Made tests/fixtures/v4/v4-held-{1,2}.
import sys, os, torch
sys.path.insert(0, os.environ.get("V4_FIXTURES_DIR", os.path.dirname(__file__)))
import v4_fixtures as F
out = sys.argv[1]
g = torch.Generator().manual_seed(98765)
quant = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic", "weight_block_size": [32, 32]}
base = dict(architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", vocab_size=768,
            bos_token_id=0, eos_token_id=1, rms_norm_eps=1e-6, rope_theta=10000.0, compress_rope_theta=160000.0,
            hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0, scoring_func="sqrtsoftplus",
            norm_topk_prob=True, routed_scaling_factor=1.5, n_shared_experts=1, num_nextn_predict_layers=0,
            tie_word_embeddings=False, max_position_embeddings=65536, torch_dtype="bfloat16")
h1 = dict(base, hidden_size=192, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1, head_dim=48,
          q_lora_rank=80, o_groups=3, o_lora_rank=40, moe_intermediate_size=96, n_routed_experts=5,
          num_experts_per_tok=2, index_n_heads=3, index_head_dim=24, index_topk=5, sliding_window=6,
          layer_types=["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
          compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
          mlp_layer_types=["moe", "hash_moe", "moe"], partial_rotary_factor=0.25,
          quantization_config=dict(quant, weight_block_size=[32, 32]), expert_dtype="fp4", swiglu_limit=1.5)
h1["rope_scaling"] = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 40, "beta_fast": 32, "beta_slow": 1}
F.make("v4-held-1", h1, 77, [F.seq(g, 768, 150), F.seq(g, 768, 20)], [61, 3], 32, torch.float32, out)
h2 = dict(base, hidden_size=96, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
          q_lora_rank=48, o_groups=2, o_lora_rank=24, moe_intermediate_size=64, n_routed_experts=7,
          num_experts_per_tok=3, index_n_heads=2, index_head_dim=32, index_topk=8, sliding_window=10,
          compress_ratios=[4, 0, 128, 4, 0], num_hash_layers=1, qk_rope_head_dim=16,
          quantization_config=dict(quant, weight_block_size=[64, 64]), expert_dtype="fp4", swiglu_limit=4.0)
h2["rope_scaling"] = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 128, "beta_fast": 32, "beta_slow": 1}
F.make("v4-held-2", h2, 5150, [F.seq(g, 768, 280), F.seq(g, 768, 9)], [140, 8], 64, torch.float8_e8m0fnu, out)
