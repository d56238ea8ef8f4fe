# Mix-LN (Li et al. 2024, arXiv:2412.13795; code pixeli99/MixLN): Post-LN in the first
# floor(mixln_alpha * n_layer) blocks, Pre-LN in the rest, and the final norm. alpha = 0.25 is the
# paper's default (with the default 4 layers: block 0 Post-LN, blocks 1-3 Pre-LN). RMSNorm, as in their
# LLaMA code (and as the baseline config/prenorm_rms.py), so the two differ only in the placement.
norm_placement = "mixln"
norm_type = "rmsnorm"
mixln_alpha = 0.25
out_dir = "out/mixln_rms"
