# ReZero (Bachlechner et al. 2020): no norm; each block adds alpha * f(x), alpha one learnable scalar
# per block starting at 0, so the model starts as the identity (python train.py --help: residual_gate).
norm_placement = "pre"
norm_type = "none"
residual_gate = "rezero"
out_dir = "out/prenorm_rezero"
