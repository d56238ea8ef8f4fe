# Pre-LN + ScaleNorm (Nguyen & Salazar 2019): x / ||x|| times one learnable scalar per norm.
norm_placement = "pre"
norm_type = "scalenorm"
out_dir = "out/prenorm_scale"
