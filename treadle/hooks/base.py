"""The base class of every hook."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple, Type

if TYPE_CHECKING:  # hooks reach the trainer through self.trainer, never by import
    from treadle.engine.train_loop import TrainerBase

__all__ = ["HookBase", "HOOK_STAGES"]

HOOK_STAGES: Tuple[str, ...] = (
    "before_train",
    "before_step",
    "after_backward",
    "after_step",
    "after_epoch",
    "after_train",
)


class HookBase:
    """Code run by :class:`~treadle.engine.TrainerBase` around each iteration.

    The loop calls, in registration order::

        hook.before_train()
        for iter in range(start_iter, max_iter):
            hook.before_step()
            trainer.run_step()        # the step object calls hook.after_backward()
            hook.after_step()         #   between backward and optimizer.step
            hook.after_epoch()        # when iter ends an epoch (see below)
        hook.after_train()            # also after an exception or a stop request

    ``after_epoch`` runs when the trainer knows its epoch length
    (``trainer.epoch_length``) and an epoch ends: after every hook's
    ``after_step`` of the epoch's last iteration, with ``trainer.epoch`` the
    0-based index of that epoch. The epoch that ends with training (the last
    one, or the part of it run before an early stop) gets its
    ``after_epoch`` during ``after_train``: just before each hook's own
    ``after_train``, so a hook registered after the ``EvalHook`` sees the
    final evaluation. A preempted or failed run calls no ``after_epoch`` for
    its unfinished epoch.

    ``self.trainer`` is a weak proxy to the trainer, set by ``register_hooks``.
    Inside every call, ``self.trainer.iter`` is the iteration being run.

    A hook with state to keep across a resume returns it from :meth:`state_dict`
    as plain data (numbers, strings, lists, dicts, tensors): checkpoints are
    loaded with ``torch.load(weights_only=True)``. The default saves the
    attributes named in :attr:`state_attributes`.

    Ordering: a hook that must run after another one (because it reads what
    that one puts into storage, say) names that hook's class in
    :attr:`runs_after`; ``register_hooks`` refuses a list that breaks it.
    """

    trainer: "TrainerBase"

    # Attribute names saved by the default state_dict/load_state_dict.
    state_attributes: Sequence[str] = ()
    # Hook classes that must come earlier in the hook list when both are registered.
    runs_after: Tuple[Type["HookBase"], ...] = ()
    # Why, for the HookOrderError's message (no order rule without a reason
    # that no other design could remove).
    order_reason: str = ""

    def before_train(self) -> None:
        """Called once, before the first iteration."""

    def after_train(self) -> None:
        """Called once after the last iteration, also when training raised or was stopped."""

    def after_epoch(self) -> None:
        """Called when an epoch ends (see the class docstring); ``trainer.epoch`` is its index."""

    def before_step(self) -> None:
        """Called before each iteration."""

    def after_backward(self) -> None:
        """Called by the step object after backward and before the optimizer step.

        Gradients are unscaled here, also under fp16 with a ``GradScaler``.
        """

    def after_step(self) -> None:
        """Called after each iteration (see :meth:`after_step_period`)."""

    def after_step_period(self) -> Optional[int]:
        """How often :meth:`after_step` has work to do, for a periodic hook.

        ``None`` (the default): every iteration. ``N``: only after iterations
        ``N - 1``, ``2N - 1``, ... and after the last one (``0``: the last one
        only); the trainer then skips the calls in between, which on a fast
        step are a measurable part of a periodic hook's cost. On the
        iterations where any hook is due, every hook's ``after_step`` runs,
        in order. Asked when training starts, after every ``before_train``
        (a period in epochs is known by then); a hook registered during
        training, and a subclass that overrides ``after_step`` but not this
        method, are called every iteration.
        """
        return None

    def _after_step_schedule(self) -> Optional[int]:
        """:meth:`after_step_period`, where it describes this class's own
        ``after_step``; else ``None``."""
        mro = type(self).__mro__
        step_owner = next(c for c in mro if "after_step" in c.__dict__)
        period_owner = next(c for c in mro if "after_step_period" in c.__dict__)
        return self.after_step_period() if issubclass(period_owner, step_owner) else None

    def state_dict(self) -> Dict[str, Any]:
        """State saved in checkpoints; an empty dict saves nothing."""
        return {name: getattr(self, name) for name in self.state_attributes}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned."""
        unknown = set(state) - set(self.state_attributes)
        if unknown:
            raise KeyError(f"{type(self).__name__} got unknown state keys {sorted(unknown)}")
        for name, value in state.items():
            setattr(self, name, value)

    def overrides(self, stage: str) -> bool:
        """Whether this hook does anything at ``stage`` (the loop skips no-op stages)."""
        return getattr(type(self), stage) is not getattr(HookBase, stage)
