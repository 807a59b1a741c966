"""Layers with a mixer slot (attention, convolution, or a parallel mix) and the two stacks."""
