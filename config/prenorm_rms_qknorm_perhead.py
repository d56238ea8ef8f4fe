# Pre-LN + RMSNorm + QK-norm with a learned temperature per head (Swin V2's scaled cosine attention):
# logits = tau_h * cos(q, k), tau_h = exp(s_h) from 10, capped at 100. Differs from prenorm_rms_qknorm.py
# only in qk_scale.
norm_placement = "pre"
norm_type = "rmsnorm"
qk_norm = True
qk_scale = "per_head"
out_dir = "out/prenorm_rms_qknorm_perhead"
