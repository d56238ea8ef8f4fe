# OLMo 2's normalization and stability recipe (OLMo et al. 2025, arXiv:2501.00656 §3.2; code
# allenai/OLMo-core, olmo2 model configs, and allenai/OLMo olmo/model.py with norm_after):
# - reordered norm: each sublayer reads the raw stream and its output is RMS-normalized before the
#   add, h = x + RMSNorm(attn(x)), out = h + RMSNorm(mlp(h)), and the final norm (placement output);
# - QK-norm over the whole query and key projections, all heads together (width C, as OLMo-core's
#   q_norm/k_norm without use_head_qk_norm), before the rotary embedding in their code;
# - RMSNorm eps 1e-6;
# - z-loss with weight 1e-5;
# - every weight initialised N(0, 0.02), with no depth-scaled residual projections.
# What differs from OLMo 2, on purpose, so that this stays a normalization ablation against
# config/prenorm_rms.py (the same GPT-2 body): learned absolute positions (OLMo 2: RoPE, theta
# 500,000: pos = "rope", rope_base = 500000.0), the GELU MLP (OLMo 2: SwiGLU: mlp = "swiglu"),
# biases (OLMo 2 has none: bias = False), the LM head tied to the token embedding (OLMo 2 unties
# them; this project always ties) and AdamW weight decay on the embedding too (OLMo 2 exempts it).
# The results in results/exp2_norm_variants_2025 were measured with an earlier version of this file:
# per-head QK-norm, eps 1e-5, no z-loss, GPT-2 init with the depth factor (each run's config.json
# keeps the settings it ran with).
norm_placement = "output"
norm_type = "rmsnorm"
qk_norm = True
qk_norm_scope = "width"
norm_eps = 1e-6
z_loss = 1e-5
init = "gpt2"
init_depth_factor = False
out_dir = "out/olmo2_rms"
