"""The worker's bottom layer: the packed batch every model, kernel, pooler, backend and the engine read.

It imports nothing of the worker's own: the layers above (kernels, models,
pooling, backends, engine) point down at it, never the other way.
"""
