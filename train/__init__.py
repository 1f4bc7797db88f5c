"""PyTorch training for rm-qdrant: backbones, the ψ/ρ heads, query adapters and baselines.

Nothing in ``rm_qdrant`` imports this package; ``rmq train`` loads it lazily.
"""
