"""A rank's checkpointed rollout state with layers around it: dynamic sampling's refill cursor and the
curriculum's queue each wrap the state beneath them as ``{key: their state, inner_key: the state beneath}``,
and unwrap it on resume. A checkpoint written without a layer is the state beneath as it is."""

from __future__ import annotations

import json
from typing import Any


def wrapped_state(key: str, state: dict[str, Any], inner: str | None, inner_key: str = "inner") -> str:
    """``inner`` (the state beneath, or None) with ``state`` under ``key`` around it."""
    return json.dumps({key: state, inner_key: inner})


def unwrapped_state(key: str, text: str | None, inner_key: str = "inner") -> tuple[str | None, dict[str, Any] | None]:
    """The state beneath and the layer's own state of :func:`wrapped_state`; a text the layer did not wrap
    (a checkpoint written without it) is the state beneath, with no layer state."""
    if text is None:
        return None, None
    try:
        parsed = json.loads(text)
    except ValueError:
        return text, None
    if isinstance(parsed, dict) and key in parsed:
        return parsed.get(inner_key), parsed[key]
    return text, None
