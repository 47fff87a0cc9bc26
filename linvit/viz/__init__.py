"""Visualisation: feature PCA colours, attention distributions of linear/softmax kernels, attention-matrix rank."""
