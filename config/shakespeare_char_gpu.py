# nanoGPT's GPU-sized "baby GPT" for TinyShakespeare, with Pre-LN + RMSNorm.
# nanoGPT reports val loss 1.4697 after ~3 minutes on one A100 with this shape (LayerNorm).
out_dir = "out/shakespeare_char_gpu"
device = "cuda"  # dtype stays "auto": bfloat16 where the GPU supports it, else float16 with a GradScaler

n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
batch_size = 64
dropout = 0.2
bias = False

norm_placement = "pre"
norm_type = "rmsnorm"

learning_rate = 1e-3
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
max_iters = 5000
lr_decay_iters = 5000
eval_interval = 250
eval_iters = 200
