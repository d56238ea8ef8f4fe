# Pre-LN + Dynamic erf (Chen et al. 2025, arXiv:2512.10938; code zlab-princeton/Derf): every norm, ln_f
# included, becomes gamma * erf(alpha * x + s) + beta, with alpha and s one learnable scalar each.
# alpha starts at derf_alpha_init (0.5, the paper's and the ViT code's default; the authors' nanoGPT patch
# defaults its three alphas, attention / FFN / final, to 1.0) and s at derf_shift_init (0). Set here so
# that a sweep can see what it varies. babygpt/norms.py, Derf, says where this differs from their patch.
norm_placement = "pre"
norm_type = "derf"
derf_alpha_init = 0.5
derf_shift_init = 0.0
out_dir = "out/prenorm_derf"
