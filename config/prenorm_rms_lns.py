# Pre-LN + RMSNorm with LayerNorm Scaling ("The Curse of Depth", Sun et al. 2025, arXiv:2502.05795;
# code lmsdss/LayerNorm-Scaling, NORM_TYPE=LNS): block l's (1-indexed) ln1 and ln2 outputs are multiplied
# by 1/sqrt(l); ln_f is not scaled. Differs from prenorm_rms.py only in ln_scaling. The paper also drops
# the depth-scaled init, which this config keeps (add --init_depth_factor=false for theirs).
norm_placement = "pre"
norm_type = "rmsnorm"
ln_scaling = True
out_dir = "out/prenorm_rms_lns"
