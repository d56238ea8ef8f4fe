"""Sample from a trained BabyGPT: python sample.py --ckpt out/prenorm_rms/best.pt  (see --help)."""

from babygpt.cli import main_sample

if __name__ == "__main__":
    main_sample()
