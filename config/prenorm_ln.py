# Pre-LN + LayerNorm (GPT-2's choice). Differs from prenorm_rms.py only in norm_type.
norm_placement = "pre"
norm_type = "layernorm"
out_dir = "out/prenorm_ln"
