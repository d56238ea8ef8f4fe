# Parallel residual + RMSNorm: x <- x + attn(ln1(x)) + mlp(ln2(x)) (GPT-J / GPT-NeoX / PaLM), with a
# norm per sublayer as in GPT-NeoX and litgpt's default (GPT-J and PaLM share one); ln_f is on.
norm_placement = "parallel"
norm_type = "rmsnorm"
out_dir = "out/parallel_rms"
