"""Train a BabyGPT: python train.py [CONFIG.py] [--key=value ...]  (see --help)."""

from babygpt.cli import main_train

if __name__ == "__main__":
    main_train()
