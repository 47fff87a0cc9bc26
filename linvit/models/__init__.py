"""Backbone families, one file each; importing this package registers them with timm."""
