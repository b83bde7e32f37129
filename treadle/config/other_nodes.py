"""Top-level config nodes that a layer above the job reads: the seam
through which another trainer's node (LiBai's ``graph``) selects treadle's
step without the config package knowing that trainer.

:data:`OTHER_NODES` is empty until such a layer registers a
:class:`NodeReader` (:mod:`treadle.compat` does, when imported, as
``tools/train_net.py`` imports it). A job reads the registered nodes as it
reads its own (:mod:`treadle.config.top_nodes`); an unregistered one is
refused there as read by nothing. This module imports no config library, so
that registering costs nothing to a script that reads no config.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

__all__ = ["NodeReader", "OTHER_NODES", "register_node"]


@dataclasses.dataclass(frozen=True)
class NodeReader:
    """How a job reads one top-level node of another trainer's config.

    Attributes:
        what: what the node is and what it does, shown where the job lists
            the nodes it reads.
        step_kind: ``step_kind(cfg, kind, kind_given) -> (kind, why)``: the
            step kind (``"eager"``/``"compiled"``) the config trains with,
            given ``train.step.kind``'s ``kind`` (``kind_given``: the user
            gave it on the command line); ``why`` is the line the job logs
            when the node changed the kind (``None`` when it did not). It
            checks the node and raises ``ConfigError`` in one line naming it.
    """

    what: str
    step_kind: Callable[[Any, str, bool], Tuple[str, Optional[str]]]


#: The registered nodes, by name.
OTHER_NODES: Dict[str, NodeReader] = {}


def register_node(name: str, reader: NodeReader) -> None:
    """Makes jobs read the top-level node ``name`` by ``reader``."""
    OTHER_NODES[name] = reader
