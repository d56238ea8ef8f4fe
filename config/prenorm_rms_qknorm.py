# Pre-LN + RMSNorm, plus QK-norm: queries and keys RMS-normalized per head before attention.
# Differs from prenorm_rms.py only in qk_norm.
norm_placement = "pre"
norm_type = "rmsnorm"
qk_norm = True
out_dir = "out/prenorm_rms_qknorm"
