"""SAE steering and monitoring inside the continuous batch.

SAEs in SAELens' on-disk format (`sae_config`, `sae`, `registry`), their math as pure functions
(`sae_math`), where they attach on an HF model (`hook_points`), and the per-step plan (`step_plan`)
that forward hooks installed once on the decoder layers carry out for the whole batch (`batch_hooks`).
"""
