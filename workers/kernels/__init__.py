"""Compute kernels with torch references: attention over packed sequences."""
