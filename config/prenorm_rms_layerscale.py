# LayerScale (Touvron et al. 2021, CaiT) on Pre-LN RMSNorm: each sublayer's output is scaled by a
# learnable per-channel vector starting at 0.1, CaiT's value for models up to 18 blocks.
norm_placement = "pre"
norm_type = "rmsnorm"
residual_gate = "layerscale"
out_dir = "out/prenorm_rms_layerscale"
