"""The root of the pipeline's own exceptions (the tree: docs/errors.md).

Each stays in the module of its concept (``Fenced`` in ``locator.py``, ``StageFenced``
in ``state.py``, ``SpecError`` in ``spec.py``, ...); this root lets a caller catch them
as one.
"""

from __future__ import annotations

from ..protocol.errors import WaymarkError


class PipelineError(WaymarkError):
    """Base of every exception the pipeline package raises."""


class EdgeMalformed(PipelineError):
    """A record of the bound generation on an edge is not a pack: the edge's topic was
    written by something other than its producers (docs/semantics/pipeline.md §3.1).
    Raised by a stage's consumer and by a Spark stage reading the edge."""
