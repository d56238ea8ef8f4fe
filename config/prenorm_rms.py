# Pre-LN + RMSNorm: the baseline every other ablation is compared with.
# Everything not set here comes from TrainConfig's defaults (python train.py --help).
norm_placement = "pre"
norm_type = "rmsnorm"
out_dir = "out/prenorm_rms"
