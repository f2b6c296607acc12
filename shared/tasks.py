"""The pooling tasks a model can serve, as one Literal and its tuple."""
from typing import Literal, get_args

PoolingTask = Literal[
    "embed",
    "classify",
    "token_embed",
    "token_classify",
]
POOLING_TASKS: tuple[PoolingTask, ...] = get_args(PoolingTask)
