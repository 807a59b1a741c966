"""sanlab: locality- and interaction-enhanced self-attention networks in one Transformer framework."""

__version__ = "0.1.0"
