# SkipInit (De & Smith 2020, arXiv:2002.10444): no norm; each sublayer's output is multiplied by its own
# learnable scalar starting at 0 (ReZero, config/prenorm_rezero.py, shares one per block).
norm_placement = "pre"
norm_type = "none"
residual_gate = "skipinit"
out_dir = "out/prenorm_skipinit"
