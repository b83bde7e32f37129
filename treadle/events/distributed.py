"""Reducing a flush's scalars across ranks in one collective."""

from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from treadle.utils import comm

from .storage import ScalarKind

__all__ = ["reduce_across_ranks", "ScalarMismatchError"]

# (name, value, ScalarKind): the value a float or a one-element tensor.
Entry = Tuple[str, Union[float, torch.Tensor], Optional[str]]


class ScalarMismatchError(RuntimeError):
    """Ranks published different scalars between two flushes."""


def _fingerprint(entries: List[Entry]) -> Tuple[float, float]:
    digest = hashlib.blake2b("\0".join(name for name, _, _ in entries).encode(), digest_size=6).digest()
    # Two 24-bit halves: exact in float64 and float32.
    return float(int.from_bytes(digest[:3], "little")), float(int.from_bytes(digest[3:], "little"))


def _local_values(entries: List[Entry], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The entries' values as one tensor on ``device``, in entry order.

    Numbers go in one tensor and tensors in one stack per (device, dtype), so
    that each group crosses to ``device`` in one copy: a copy per value would
    be ~60 host-to-device copies a flush under NCCL, each a possible sync.
    """
    groups: Dict[Optional[Tuple[torch.device, torch.dtype]], list] = {}
    # [group, start, stop] of consecutive entries of one group: the collective
    # needs entry order, the same on every rank whatever each rank's types.
    runs: List[list] = []
    for _, value, _ in entries:
        key = (value.device, value.dtype) if isinstance(value, torch.Tensor) else None
        members = groups.setdefault(key, [])
        if runs and runs[-1][0] == key:
            runs[-1][2] += 1
        else:
            runs.append([key, len(members), len(members) + 1])
        members.append(value.detach().reshape(()) if isinstance(value, torch.Tensor) else value)
    moved = {
        key: (torch.tensor(members, dtype=torch.float64) if key is None else torch.stack(members)).to(
            device=device, dtype=dtype
        )
        for key, members in groups.items()
    }
    if len(runs) == 1:
        return moved[runs[0][0]]
    return torch.cat([moved[key][start:stop] for key, start, stop in runs])


def _all_gather_single(output: torch.Tensor, local: torch.Tensor) -> None:
    """Every rank's ``local``, concatenated into ``output``, on each rank."""
    # torch 2.13 has it as all_gather_single and deprecates its older name,
    # all_gather_into_tensor, the only one torch 2.11 and earlier have.
    # Looked up at each call, not at import: tests count collectives by
    # replacing them on the module.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, local)


def reduce_across_ranks(entries: List[Entry]) -> List[float]:
    """Means (losses, metrics, other scalars) and maxima (times) over all ranks.

    Installed as :attr:`~treadle.events.EventStorage.reducer` by the trainer when the world
    size is above one; it runs at each flush, on every rank at once, and is
    the only communication of a flush: two ``all_gather_single`` calls
    (``all_gather_into_tensor`` before torch 2.13).
    The first carries a fingerprint of the names and their count (three
    numbers), the second every rank's pending values. The header goes first
    because a collective needs the same size on every rank: ranks that
    published different scalars (a scalar put on the main process only, say)
    then fail together with a :class:`ScalarMismatchError` naming the
    difference, instead of a gloo abort, an NCCL hang or mixed-up values.

    Returns:
        the reduced values as floats, in entry order, read back in one copy.

    Raises:
        ScalarMismatchError: the names (or their order) differ between ranks.
    """
    world = comm.get_world_size()
    if world == 1:
        return _local_values(entries, torch.device("cpu"), torch.float64).tolist() if entries else []
    # No shortcut for an empty flush: a rank with nothing pending must still
    # meet the others here, or they would wait for it.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    header = torch.tensor([*_fingerprint(entries), float(len(entries))], dtype=dtype, device=device)
    headers = torch.empty(world * header.numel(), dtype=dtype, device=device)
    _all_gather_single(headers, header)
    if not torch.equal(headers.view(world, -1), header.expand(world, -1)):
        names = comm.all_gather([name for name, _, _ in entries])  # only on this error path
        differing = {r: n for r, n in enumerate(names) if n != names[comm.get_rank()]}
        raise ScalarMismatchError(
            f"Ranks published different scalars since the last flush; rank {comm.get_rank()} has "
            f"{names[comm.get_rank()]}, but " + "; ".join(f"rank {r} has {n}" for r, n in differing.items())
            + ". Publish the same scalars on every rank (or only from one rank, outside the storage)."
        )
    if not entries:
        return []
    local = _local_values(entries, device, dtype)
    gathered = torch.empty(world * local.numel(), dtype=dtype, device=device)
    _all_gather_single(gathered, local)
    per_rank = gathered.view(world, -1)
    # Both reductions come back in the one copy and each entry's is picked
    # here: a mask of times on the device would be one more copy to it.
    maxima, means = torch.stack([per_rank.amax(dim=0), per_rank.mean(dim=0)]).cpu().tolist()
    return [
        largest if kind == ScalarKind.TIME else mean
        for (_, _, kind), largest, mean in zip(entries, maxima, means)
    ]
