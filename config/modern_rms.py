# The block of today's open models at this size, on train.py's default shape (4 layers x 128, ctx 64,
# 2,400 iterations): Pre-LN RMSNorm, rotary positions, a SwiGLU MLP sized to the GELU MLP's parameters,
# QK-norm per head (before the rotation, as Qwen3), output projections starting at zero, no biases,
# and Muon for the blocks' matrices (AdamW at learning_rate for embeddings, head, gains and scalars).
# config/modern_rms_adamw.py is the same model trained by AdamW alone. Neither LR is tuned for this
# model yet: both are train.py's defaults (README, "Configs").
norm_placement = "pre"
norm_type = "rmsnorm"
pos = "rope"
mlp = "swiglu"
qk_norm = True
zero_init_proj = True
bias = False
optimizer = "muon"
out_dir = "out/modern_rms"
