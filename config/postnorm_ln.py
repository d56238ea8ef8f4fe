# Post-LN + LayerNorm (the original Transformer). The final norm is off by default
# for Post-LN: the last block's ln2 already normalizes the output.
norm_placement = "post"
norm_type = "layernorm"
out_dir = "out/postnorm_ln"
