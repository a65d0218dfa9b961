"""The model: a Llama-family forward with explicit positions, RoPE and CoPE, and loading."""
