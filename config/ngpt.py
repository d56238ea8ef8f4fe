# nGPT (Loshchilov et al. 2024, arXiv:2410.01131; code NVIDIA/ngpt): the stream and every matrix on the
# unit sphere, each block moving the stream towards its sublayers' normalized outputs by learned
# eigen learning rates; no norm layers, no biases, and, as the paper trains it, no weight decay, no
# warmup and no dropout (babygpt/placements.py, NGPT, says where this model differs from theirs).
# Not copied: the code's AdamW beta2 0.95 and min_lr 0 (NVIDIA/ngpt train.py); this project's own beta2
# and min_lr stay, as for every other config, so that nGPT is compared with the baseline on the
# optimizer settings the baseline was tuned with (set beta2 = 0.95, min_lr = 0.0 here for theirs).
norm_placement = "ngpt"
norm_type = "none"
bias = False
weight_decay = 0.0
warmup_iters = 0
out_dir = "out/ngpt"
