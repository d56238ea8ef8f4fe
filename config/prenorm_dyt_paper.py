# Pre-LN + DyT with the language-model recipe of Zhu et al. 2025 (arXiv:2503.10622, Appendix A and
# Tables 10-11; the authors' other_tasks/LLaMA code):
# - a learnable scalar after the token embedding, initialised to sqrt(n_embd);
# - DyT without beta, and Linear layers without biases, as in their LLaMA (bias = False drops both);
# - alpha_0 set apart for the DyT before attention (ln1) and the others (ln2, ln_f). The paper's
#   Table 11 gives 1.0 / 1.0 at width 1024 (its narrowest; 0.8 / 0.2 at 4096) and finds depth has
#   little effect, so this model (width 128) takes the narrowest row.
norm_placement = "pre"
norm_type = "dyt"
bias = False
emb_scale_learnable = True
dyt_alpha_init_attn = 1.0
dyt_alpha_init = 1.0
out_dir = "out/prenorm_dyt_paper"
