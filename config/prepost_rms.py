# Pre + post-main norm + RMSNorm: x <- norm(x + f(norm(x))) around each sublayer (x-transformers'
# pre_and_post_norm), four norms per block; the last block's post norm normalizes the output, so no ln_f.
norm_placement = "prepost"
norm_type = "rmsnorm"
out_dir = "out/prepost_rms"
