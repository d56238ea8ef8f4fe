# HybridNorm (Zhuo et al. 2025, arXiv:2503.04598; code BryceZhuo/HybridNorm): attention normalizes its
# queries, keys and values per head and reads the raw stream; the FFN is Post-Norm (it adds to the
# normalized stream); final norm on. RMSNorm, as in the code and the baseline config/prenorm_rms.py.
norm_placement = "hybrid"
norm_type = "rmsnorm"
out_dir = "out/hybrid_rms"
