"""The model: one forward for every registered family (families/), with explicit positions,
the attention spec, RoPE (+ per-layer re-rotation), CoPE, and loading."""
