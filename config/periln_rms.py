# Peri-LN as Kim et al. 2025 define it (arXiv:2502.02732): each sublayer's input and output normalized,
# y = x + Norm(Module(Norm(x))) (the sandwich placement), plus a norm on the embedding output and the
# final norm before the LM head. The output norms' gains are learnable and start at 1. RMSNorm, as in
# config/sandwich_rms.py, so the two differ only in the embedding norm.
norm_placement = "sandwich"
norm_type = "rmsnorm"
emb_norm = True
out_dir = "out/periln_rms"
