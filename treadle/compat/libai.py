"""LiBai's names outside its trainer's methods: what its users write where
treadle's core and config would not know them.

- ``EagerTrainer(model, data_loader, optimizer, grad_acc_steps)``: a step
  written that way is refused by the core in one line; this module adds
  which keyword the fourth argument is (:func:`positional_hint`);
- ``graph = dict(enabled=True)`` in a config ("the mode is determined by the
  ``graph.enabled`` parameter"): the top-level node ``graph`` selects
  treadle's compiled step (:func:`graph_step_kind`).

Both fill seams of the core when :mod:`treadle.compat` is imported (the
plain ``Trainer`` and ``tools/train_net.py`` import it):
``treadle.engine.steps.POSITIONAL_HINTS`` and
:func:`treadle.config.other_nodes.register_node`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Tuple

from treadle.config.errors import ConfigError
from treadle.config.other_nodes import NodeReader, register_node
from treadle.config.rules import shown
from treadle.engine.steps import POSITIONAL_HINTS

__all__ = ["positional_hint", "graph_step_kind", "GRAPH"]


def positional_hint(step: str, rest: Tuple[Any, ...]) -> Optional[str]:
    """LiBai's ``EagerTrainer(model, data_loader, optimizer, grad_acc_steps)``
    written for a step: the keyword the fourth argument is."""
    if len(rest) != 1:
        return None
    return (f"LiBai's EagerTrainer(model, data_loader, optimizer, grad_acc_steps) is {step}(model, data_loader, "
            f"optimizer, grad_accum_steps={rest[0]!r})")


def graph_step_kind(cfg: Any, kind: str, kind_given: bool) -> Tuple[str, Optional[str]]:
    """The step LiBai's ``graph`` node selects, and the line that says so.

    ``graph.enabled=True`` selects ``"compiled"`` (treadle's ``CompiledStep``,
    through ``torch.compile``; ``train.step.kind`` is then ``'compiled'`` or
    its default ``'eager'``, which ``graph.enabled`` overrides), ``False``
    the eager step. ``graph`` takes no other key (LiBai's ``debug``,
    ``train_graph``... configure OneFlow's ``nn.Graph``).

    Raises:
        ConfigError: ``graph.enabled`` is not a bool, ``graph`` holds another
            key, ``graph.enabled`` asks for another step than a ``train.step.kind``
            the user gave (``'compiled'``, or ``'eager'`` with ``kind_given``),
            or ``graph.enabled=True`` with a step of the user's own (``train.step._target_``).
    """
    graph = cfg.get("graph")
    if not isinstance(graph, Mapping):
        raise ConfigError(f"graph must be a node with the key enabled (graph = dict(enabled=True)), got {shown(graph)}")
    others = [str(k) for k in graph.keys() if k != "enabled"]
    if others:
        raise ConfigError(
            f"graph.{others[0]} is a setting of LiBai's OneFlow graph, which treadle does not have: treadle reads "
            "graph.enabled only (True trains with CompiledStep, as train.step.kind='compiled'); remove it"
        )
    if "enabled" not in graph:
        return kind, None
    enabled = graph["enabled"]
    if not isinstance(enabled, bool):
        raise ConfigError(f"graph.enabled must be True or False, got {shown(enabled)}")
    train = cfg.get("train")
    step = train.get("step") if isinstance(train, Mapping) else None
    if enabled and isinstance(step, Mapping) and "_target_" in step:
        raise ConfigError(
            "graph.enabled=True compiles treadle's step, and train.step is a step of your own (train.step._target_): "
            "remove graph.enabled, or train.step._target_"
        )
    wanted = "compiled" if enabled else "eager"
    # 'compiled' is never the default: it is the user's choice, as 'eager' is when given.
    chosen = kind == "compiled" or (kind_given and kind == "eager")
    if chosen and kind != wanted:
        raise ConfigError(
            f"graph.enabled={enabled} asks for the {wanted} step and train.step.kind={kind!r} for the {kind} one: "
            "give train.step.kind only (treadle's key)"
        )
    if wanted == kind:
        return kind, None
    return wanted, (f"graph.enabled={enabled} (LiBai's graph mode): training with "
                    f"{'CompiledStep' if enabled else 'EagerStep'}, as train.step.kind={wanted!r}")


#: LiBai's ``graph`` node, as jobs read it.
GRAPH = NodeReader("LiBai's graph mode: graph.enabled=True selects train.step.kind='compiled'", graph_step_kind)

register_node("graph", GRAPH)
POSITIONAL_HINTS.append(positional_hint)
