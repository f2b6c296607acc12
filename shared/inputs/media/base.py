"""What a media plan is (``shared.inputs.media``), and how ``plans.PLANS`` builds one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from poolgate.shared.domain.media_limits import MediaLimits
    from poolgate.shared.inputs.encoded import Encoded, TextEncoder
    from poolgate.shared.wire.messages import ModelInfo, PoolingCall


class MediaPlan(Protocol):
    """One media model's input shaping (``shared.inputs.media``). A plan whose model renders a conversation with
    its chat template says ``renders_chats = True`` (the chat options then reach it); for the others the input
    stage refuses those options rather than ignore them."""

    def encode(self, call: PoolingCall, limits: MediaLimits) -> Encoded:
        """The call's inputs (texts, ``MediaInput``s, token ids where the model takes them) as ids and items."""
        ...


PlanFactory = Callable[["ModelInfo", "TextEncoder", dict[str, Any]], MediaPlan]
