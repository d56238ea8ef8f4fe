# Admin (Liu et al. 2020, arXiv:2004.08249; code LiyuanLucasLiu/Transformer-Clinic): Post-LN with the
# residual weighted per channel by omega, LN(x * omega + f(x)), omega profiled on one batch before
# training. LayerNorm and Xavier init, as in the paper's Post-LN setup (the code is fairseq's
# Transformer); the config sets the paper's init, as the DyT recipe config sets its own keys.
norm_placement = "admin"
norm_type = "layernorm"
init = "xavier"
out_dir = "out/admin_ln"
