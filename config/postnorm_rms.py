# Post-LN + RMSNorm.
norm_placement = "post"
norm_type = "rmsnorm"
out_dir = "out/postnorm_rms"
