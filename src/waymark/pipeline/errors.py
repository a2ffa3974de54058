"""The root of the pipeline's own exceptions (the tree: docs/errors.md).

Each stays in the module of its concept (``Fenced`` in ``locator.py``, ``StageFenced``
in ``state.py``, ``SpecError`` in ``spec.py``, ...); this root lets a caller catch them
as one.
"""

from __future__ import annotations

from ..protocol.errors import WaymarkError


class PipelineError(WaymarkError):
    """Base of every exception the pipeline package raises."""
