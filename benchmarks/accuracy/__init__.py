"""Accuracy benchmarks: linvit models beside timm models of similar size, trained with the same recipe."""
