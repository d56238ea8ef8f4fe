# config/modern_rms.py's model (Pre-LN RMSNorm, RoPE, SwiGLU, QK-norm, zero-initialised projections,
# no biases) trained by AdamW alone, the twin that isolates what Muon does. Its learning_rate is
# train.py's default, tuned for the GPT-2 block, not for this one.
norm_placement = "pre"
norm_type = "rmsnorm"
pos = "rope"
mlp = "swiglu"
qk_norm = True
zero_init_proj = True
bias = False
optimizer = "adamw"
out_dir = "out/modern_rms_adamw"
