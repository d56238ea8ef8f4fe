# Sandwich-LN / Peri-LN + RMSNorm: a norm on each sublayer's input and output, and the final norm.
norm_placement = "sandwich"
norm_type = "rmsnorm"
out_dir = "out/sandwich_rms"
