"""What the worker decides and loads before the engine's first step: whether the engine computes the model as HF
does, which quantization it loads, the target model's weights, and their layout on CPU."""
