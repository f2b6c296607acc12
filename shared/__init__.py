"""Torch-free code that both the gateway and the workers import."""
