"""The base class of every hook."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple, Type, TypeVar

from treadle.events import EventStorage

__all__ = ["HookBase", "HOOK_STAGES", "TrainerProtocol"]

H = TypeVar("H", bound="HookBase")

#: The methods of a hook the loop calls, in the order it calls them: the
#: stages a hook may override, and the columns of the engine's hook table.
HOOK_STAGES: Tuple[str, ...] = (
    "before_train",
    "before_epoch",
    "before_step",
    "after_backward",
    "after_step",
    "after_epoch",
    "after_iteration",
    "after_train",
)


class TrainerProtocol(Protocol):
    """What the loop offers a hook (and a step object) through ``self.trainer``.

    :class:`~treadle.engine.TrainerBase` satisfies it; hooks are typed with
    it, never with the engine's classes, so that the layers' imports point
    down (``treadle.hooks`` imports nothing of ``treadle.engine``). A hook
    that needs what a particular trainer adds (``trainer.checkpointer``, a
    step's ``model``) looks it up with ``getattr`` and says what it needs.
    """

    #: The iteration being run (in ``after_train``: one past the last one run).
    iter: int
    start_iter: int
    max_iter: int
    #: Iterations per epoch where the data has a length; the index of the
    #: epoch that begins, during ``before_epoch``, and of the epoch that
    #: ended, during ``after_epoch``.
    epoch_length: Optional[int]
    epoch: Optional[int]
    #: During ``after_train``: the exception that ended training, whether a
    #: stop request cut the run short, whether it finished.
    training_error: Optional[BaseException]
    interrupted: bool
    finished: bool
    #: ``time.perf_counter()`` when the iteration began and when its step returned.
    iter_start_time: float
    step_end_time: float
    storage: EventStorage

    @property
    def last_run_iter(self) -> int: ...

    @property
    def hooks(self) -> List["HookBase"]: ...

    @property
    def step(self) -> Any: ...

    def request_stop(self, reason: str, *, interrupted: bool = False) -> None: ...

    def plan_periods_again(self) -> None: ...

    def after_backward(self) -> None: ...

    def timings(self) -> Dict[str, float]: ...


class HookBase:
    """Code run by :class:`~treadle.engine.TrainerBase` around each iteration.

    The loop calls, in registration order::

        hook.before_train()
        for iter in range(start_iter, max_iter):
            hook.before_epoch()       # when iter begins an epoch (see below)
            hook.before_step()
            trainer.run_step()        # the step object calls hook.after_backward()
            hook.after_step()         #   between backward and optimizer.step
            hook.after_epoch()        # when iter ends an epoch (see below)
            hook.after_iteration()    # every hook's after_step (and after_epoch) has run
        hook.after_train()            # also after an exception or a stop request

    ``after_iteration`` is for work that needs the state every hook leaves at
    the iteration, whatever the order the hooks were registered in: a
    checkpoint taken there holds each hook's finished state
    (``PeriodicCheckpointer`` and ``PreemptionHandler`` save there).

    ``before_epoch`` runs when the trainer knows its epoch length and an
    epoch begins: before every hook's ``before_step`` of the epoch's first
    iteration, with ``trainer.epoch`` the 0-based index of that epoch. A run
    resumed inside an epoch calls none for it (the epoch began in the run
    that was interrupted); its ``trainer.epoch`` is that epoch's index from
    its first iteration on, as in the uninterrupted run.

    ``after_epoch`` runs when the trainer knows its epoch length
    (``trainer.epoch_length``) and an epoch ends: after every hook's
    ``after_step`` of the epoch's last iteration, with ``trainer.epoch`` the
    0-based index of that epoch. Every epoch ends so, the last one too: the
    run's last iteration ends it (a run may end inside an epoch), and so does
    a stop request that ends the run (early stopping: the epoch ends with
    the part of it that ran). The :class:`~treadle.hooks.EvalHook` evaluates
    the final weights in the last iteration's ``after_step``, so the last
    epoch's ``after_epoch`` sees them. A preempted or failed run calls no
    ``after_epoch`` for its unfinished epoch.

    ``self.trainer`` is a weak proxy to the trainer, set by ``register_hooks``.
    Inside every call, ``self.trainer.iter`` is the iteration being run.

    A hook with state to keep across a resume returns it from :meth:`state_dict`
    as plain data (numbers, strings, lists, dicts, tensors): checkpoints are
    loaded with ``torch.load(weights_only=True)``. The default saves the
    attributes named in :attr:`state_attributes`.

    Order, the one rule: hooks run in the order of the hook list, as in
    detectron2. A hook that must run after another one (because it reads
    what that one produces at the same iteration) names that hook's class in
    :attr:`runs_after`; ``register_hooks`` refuses a list that breaks it,
    with a :class:`~treadle.engine.HookOrderError` that says why. A hook
    that needs another hook's instance without an order (a checkpointer
    that flushes the writers first) names its class in :attr:`uses`. Either
    way it finds the registered instances with :meth:`hooks_of`, resolved
    once at registration, never by scanning ``trainer.hooks``.
    ``after_step`` and ``after_iteration`` run at the iterations
    :meth:`after_step_period` and :meth:`after_iteration_period` declare,
    the run's last one included where :attr:`runs_at_last_iteration` says
    so, and nowhere else: a hook never checks its own period.
    """

    trainer: TrainerProtocol

    #: Attribute names saved by the default state_dict/load_state_dict.
    state_attributes: Sequence[str] = ()
    #: Hook classes that must come earlier in the hook list when both are registered.
    runs_after: Tuple[Type["HookBase"], ...] = ()
    #: Why, for the HookOrderError's message (no order rule without a reason
    #: that no other design could remove).
    order_reason: str = ""
    #: Hook classes whose registered instances this hook works with, in any order.
    uses: Tuple[Type["HookBase"], ...] = ()
    #: Whether a periodic stage (:meth:`after_step_period`,
    #: :meth:`after_iteration_period`) also runs after the run's last
    #: iteration. False for a hook whose ``after_train`` does that
    #: iteration's work (``model_final``). Read when
    #: training starts, after every ``before_train`` (a hook may set it there).
    runs_at_last_iteration: bool = True
    #: How to give this hook another scalar name (a call to write), for the
    #: message that refuses two hooks declaring one name (``scalar_names()``).
    rename_hint: str = ""
    # The registered hooks of the declared classes (attach_peers).
    _peers: Sequence["HookBase"] = ()

    def before_train(self) -> None:
        """Called once, before the first iteration."""

    def after_train(self) -> None:
        """Called once after the last iteration, also when training raised or was stopped."""

    def before_epoch(self) -> None:
        """Called when an epoch begins (see the class docstring); ``trainer.epoch`` is its index."""

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

    def after_iteration(self) -> None:
        """Called when an iteration ends, after every hook's ``after_step`` and
        ``after_epoch`` of it (see :meth:`after_iteration_period`)."""

    def after_step_period(self) -> Optional[int]:
        """The iterations where :meth:`after_step` runs, for a periodic hook.

        ``None`` (the default): every iteration. ``N``: after iterations
        ``N - 1``, ``2N - 1``, ...; ``0``: at no period. Either way also after
        the run's last iteration where :attr:`runs_at_last_iteration` (the
        default). The trainer calls ``after_step`` there and nowhere else,
        so the hook need not check its period again; the calls in between,
        which on a fast step are a measurable part of a periodic hook's
        cost, are not made. A subclass inherits the period with the rest of
        the class: one whose own ``after_step`` has work at every iteration
        returns ``None`` here. Asked when training starts, after every
        ``before_train`` (a period in epochs is known by then); a hook
        registered during training is called every iteration of that
        training.
        """
        return None

    def after_iteration_period(self) -> Optional[int]:
        """The iterations where :meth:`after_iteration` runs: as
        :meth:`after_step_period` says for ``after_step``."""
        return None

    def scalar_names(self) -> Tuple[str, ...]:
        """The scalar names this hook puts into the storage as their one producer.

        Read once, by ``register_hooks``, which refuses two registered hooks
        that declare one name: their values would land in one series, and
        writers keep one value per name and iteration (one of the two rates
        of a GAN's two ``LRScheduler`` hooks would be lost without a word).
        Empty by default: a hook whose names are known only when it runs
        declares none. Names put by ``put_scalar`` are not checked as they are
        put (see ``docs/engine.md``, "One name, one producer").
        """
        return ()

    def hooks_of(self, kind: Type[H]) -> List[H]:
        """The registered hooks of class ``kind``, in call order.

        ``kind`` must be named in :attr:`runs_after` or :attr:`uses`: the
        dependency is declared by the class and resolved when hooks are
        registered. Empty before registration and when none is registered.
        """
        if not any(issubclass(kind, declared) for declared in (*self.runs_after, *self.uses)):
            raise TypeError(
                f"{type(self).__name__}.hooks_of({kind.__name__}): declare {kind.__name__} in "
                f"{type(self).__name__}.runs_after or .uses first"
            )
        return [h for h in self._peers if isinstance(h, kind)]

    def attach_peers(self, peers: Sequence["HookBase"]) -> None:
        """Called by ``register_hooks`` with the registered hooks of the classes
        this hook declares (:attr:`runs_after`, :attr:`uses`), for :meth:`hooks_of`."""
        self._peers = list(peers)

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
