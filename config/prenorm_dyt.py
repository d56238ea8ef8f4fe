# Pre-LN + Dynamic Tanh (Zhu et al. 2025): every norm, ln_f included, becomes gamma * tanh(alpha * x) + beta.
# alpha starts at dyt_alpha_init; 0.5 is the paper's default, set here so a sweep can see what it varies.
norm_placement = "pre"
norm_type = "dyt"
dyt_alpha_init = 0.5
out_dir = "out/prenorm_dyt"
