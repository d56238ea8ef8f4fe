# Pre-LN + RMSNorm without its gain vector (parameter-free norms, as in recent small GPTs).
norm_placement = "pre"
norm_type = "rmsnorm_noparam"
out_dir = "out/prenorm_rmsnoparam"
