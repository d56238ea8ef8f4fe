# Pre-LN + RMSNorm + QK-norm whose logit scale is learned (Henry et al. 2020, arXiv:2010.04245):
# logits = g * cos(q, k), one g per layer from log2(T^2 - T). Differs from prenorm_rms_qknorm.py only in qk_scale.
norm_placement = "pre"
norm_type = "rmsnorm"
qk_norm = True
qk_scale = "learned"
out_dir = "out/prenorm_rms_qknorm_learned"
