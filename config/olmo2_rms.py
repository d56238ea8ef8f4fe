# OLMo 2's normalization (OLMo et al. 2025, arXiv:2501.00656; code allenai/OLMo olmo/model.py, norm_after):
# each sublayer reads the raw stream and its output is RMS-normalized before the add,
# h = x + RMSNorm(attn(x)), out = h + RMSNorm(mlp(h)); QK-norm; and the final norm. OLMo 2 normalizes
# the whole query/key projections across heads; qk_norm here normalizes each head on its own.
norm_placement = "output"
norm_type = "rmsnorm"
qk_norm = True
out_dir = "out/olmo2_rms"
