# No normalization anywhere (norm_type "none" makes every norm, ln_f included, the identity).
# A run that diverges is a result to record, not a bug.
norm_placement = "pre"
norm_type = "none"
out_dir = "out/prenorm_none"
