"""Attention operators: tensors in, tensors out (functional cores and thin modules)."""
