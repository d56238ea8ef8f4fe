# Pre-LN + BatchNorm over batch and time. For teaching only: in training its statistics include
# later positions, so the model can read the future; its train loss is not comparable with the others.
norm_placement = "pre"
norm_type = "batchnorm"
out_dir = "out/prenorm_bn"
