"""Poolers: a pooling method (CLS, MEAN, LAST; ALL, STEP per token; SPLADE) × a head, dispatched by task.

``methods`` (the methods), ``rows`` (which token rows a token method keeps),
``head`` / ``classify`` (embed and classify heads), ``dispatch`` (Pooler and
the per-task DispatchPooler), ``for_model`` (which poolers a model gets),
``splade`` and ``bge_m3`` (the sparse and multi-vector families).
"""
