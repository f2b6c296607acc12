"""Poolers: a pooling method (CLS, MEAN, LAST) times a head, dispatched by task."""
from poolgate.workers.pooling.methods import POOLING_TYPES

__all__ = ["POOLING_TYPES"]
