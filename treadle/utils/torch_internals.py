"""torch's private names that treadle uses, in one place, each with the reason.

Where torch has no public call for what treadle needs, the private one is
wrapped here, so that a torch release that changes it breaks this module
only, and the versions tried (``noxfile.py``) say whether it did.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, FrozenSet, Mapping, Optional

import torch

__all__ = [
    "foreach_norm",
    "foreach_mul",
    "foreach_div_",
    "foreach_add_",
    "foreach_sub_",
    "foreach_lerp_",
    "compiled_module",
    "state_dict_metadata",
    "set_state_dict_metadata",
    "dynamo_supported",
    "weights_only_globals",
    "summary_file_writer",
    "event_file_path",
    "quiet_event_file_thread_errors",
    "grad_scaler_scale",
    "stager_copy_rules",
    "dataloader_batches_taken",
]

# The multi-tensor kernels of torch's own optimizers: one launch for a list
# of tensors instead of one per tensor (SAM's perturbation, the EMA's update,
# the mean of a Hezar training_step's accumulated gradients).
# torch keeps them private and uses them publicly in torch.optim.
foreach_norm: Callable[..., Any] = torch._foreach_norm
foreach_mul: Callable[..., Any] = torch._foreach_mul
foreach_div_: Callable[..., None] = torch._foreach_div_
foreach_add_: Callable[..., None] = torch._foreach_add_
foreach_sub_: Callable[..., None] = torch._foreach_sub_
foreach_lerp_: Callable[..., None] = torch._foreach_lerp_


def compiled_module(model: Any) -> Optional[torch.nn.Module]:
    """The module a ``torch.compile``'d model wraps (its ``_orig_mod``), or
    None for a model that is not one. Looked up in ``sys.modules``: a plain
    model does not pay for importing ``torch._dynamo``."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is not None and isinstance(model, eval_frame.OptimizedModule):
        return model._orig_mod
    return None


def state_dict_metadata(state: Mapping[str, Any]) -> Optional[Any]:
    """The per-module versions a ``state_dict()`` carries in its
    ``_metadata`` attribute (what ``load_state_dict`` reads to upgrade old
    formats); None where there are none."""
    return getattr(state, "_metadata", None)


def set_state_dict_metadata(state: Any, metadata: Any) -> None:
    """Gives a rebuilt state dict the ``_metadata`` of the one it came from."""
    state._metadata = metadata


def grad_scaler_scale(scaler: Any) -> Optional[torch.Tensor]:
    """A ``GradScaler``'s scale as the tensor it keeps (``_scale``), or None
    before its first step: ``get_scale()`` would read it on the host."""
    return getattr(scaler, "_scale", None)


def stager_copy_rules(stager: Any) -> Optional[Any]:
    """The copy rules (``_deepcopy_dispatch``) of a DCP ``DefaultStager``'s
    copier (``_state_dict_stager``): emptied when the copier is closed. None
    for a stager whose inside is not this one."""
    copier = getattr(stager, "_state_dict_stager", None)
    return getattr(copier, "_deepcopy_dispatch", None)


def dataloader_batches_taken(iterator: Any) -> Optional[int]:
    """The batches a torch ``DataLoader``'s iterator has yielded so far in its
    pass (``_num_yielded``: those taken, not those its workers prefetched),
    which torch does not say publicly; None for any other iterator."""
    if isinstance(iterator, torch.utils.data.dataloader._BaseDataLoaderIter):
        return int(iterator._num_yielded)
    return None


def dynamo_supported() -> bool:
    """Whether ``torch.compile`` can run on this platform and Python version."""
    return bool(torch._dynamo.is_dynamo_supported())


def weights_only_globals() -> FrozenSet[Any]:
    """What torch's weights-only unpickler rebuilds by default (its allow list)."""
    from torch._weights_only_unpickler import _get_allowed_globals

    return frozenset(_get_allowed_globals().values())


def summary_file_writer(summary_writer: Any) -> Any:
    """The event-file writer behind a ``torch.utils.tensorboard.SummaryWriter``:
    rows go to it as one ``Summary`` each, where ``add_scalar`` would make
    one protobuf per value."""
    return summary_writer._get_file_writer()


def event_file_path(summary_writer: Any) -> str:
    """The event file a ``SummaryWriter`` writes, for errors that name it:
    TensorBoard keeps its name in a private attribute (its directory where
    it has none)."""
    event_writer = getattr(getattr(summary_writer, "file_writer", None), "event_writer", None)
    return str(getattr(event_writer, "_file_name", None) or summary_writer.log_dir)


_quiet_hook_installed = False


def quiet_event_file_thread_errors() -> None:
    """Keeps the traceback of a failed event-file write (a full disk) off stderr.

    TensorBoard's writer thread (``_AsyncWriterThread``) keeps the error for
    the writer's next call in the training thread, then raises it again, so
    Python prints its traceback; the training thread then reports the same
    error, naming the file, in one line (``TensorboardWriter``). Installed
    once: a ``threading.excepthook`` that passes every other exception on.
    """
    global _quiet_hook_installed
    if _quiet_hook_installed:
        return
    previous = threading.excepthook

    def hook(args: Any) -> None:
        thread = args.thread
        if (
            issubclass(args.exc_type, OSError)
            and type(thread).__name__ == "_AsyncWriterThread"
            and type(thread).__module__.startswith("tensorboard.")
        ):
            return  # raised again, naming the file, by the writer's next call
        previous(args)

    threading.excepthook = hook
    _quiet_hook_installed = True
