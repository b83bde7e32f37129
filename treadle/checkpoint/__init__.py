"""Checkpoints: atomic saves, safe (weights-only) loads, resume and weight initialization.

See ``docs/checkpoints.md``.
"""

from treadle.utils.atomic import atomic_write, is_local_path
from .checkpointer import Checkpointer

from .key_matching import (
    LoadReport,
    ShapeMismatch,
    canonical_keys,
    extract_model_state,
    load_model_state,
    model_state_for_saving,
    unwrap_model,
)
from .weights import init_weights_from
from .replicas import ReplicasDifferError, check_replicas_agree, weights_fingerprint
from .serialization import (
    CheckpointError,
    ResumeRefusedError,
    UnsafeCheckpointError,
    check_checkpoint_file,
    check_weights_only_loadable,
    load_checkpoint_file,
    save_with_checksums,
)

#: detectron2's name: the same checkpointer (its key-matching heuristics are
#: ``load(path, matching_heuristics=True)`` or ``path + "?matching_heuristics=True"``).
DetectionCheckpointer = Checkpointer

__all__ = [
    "Checkpointer",
    "DetectionCheckpointer",
    "CheckpointError",
    "UnsafeCheckpointError",
    "ResumeRefusedError",
    "ReplicasDifferError",
    "check_replicas_agree",
    "weights_fingerprint",
    "LoadReport",
    "ShapeMismatch",
    "init_weights_from",
    "load_model_state",
    "extract_model_state",
    "unwrap_model",
    "model_state_for_saving",
    "canonical_keys",
    "check_weights_only_loadable",
    "check_checkpoint_file",
    "load_checkpoint_file",
    "save_with_checksums",
    "atomic_write",
    "is_local_path",
]
