# HybridNorm* (Zhuo et al. 2025, arXiv:2503.04598): HybridNorm, with block 0 Pre-LN around both
# sublayers (its attention still normalizes q, k and v), the variant the paper recommends.
norm_placement = "hybrid_star"
norm_type = "rmsnorm"
out_dir = "out/hybrid_star_rms"
