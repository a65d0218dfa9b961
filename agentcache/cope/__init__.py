"""CoPE adapter pre-training and adapter files: data, training loop, checkpoints, CLI."""
