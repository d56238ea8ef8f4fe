# DeepNorm + LayerNorm (Wang et al. 2022): Post-LN with the residual scaled by (2N)^(1/4) and the
# FFN, value and output projections initialised scaled by (8N)^(-1/4). Final norm off, as for Post-LN.
norm_placement = "deepnorm"
norm_type = "layernorm"
out_dir = "out/deepnorm_ln"
