"""Data-parallel training over several processes (``torchrun``): one process per GPU, or per CPU share.

``torchrun --nproc-per-node N -m crl_agent.train ...`` starts N copies of the trainer; each reads its
rank from the environment torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``). ``accelerate launch --multi_gpu`` runs torchrun and so sets the same variables; an MPI
launch (``mpirun``, or ``accelerate launch --cpu --mpirun_hostfile``) sets its own, which are read when the
torchrun ones are absent (Open MPI, MPICH/Intel MPI, MVAPICH2; MASTER_ADDR/MASTER_PORT still name the
rendezvous). Every rank holds the same actor weights and plays its share of each step's groups;
the learners average their gradients before each optimiser step, so the weights stay identical
everywhere (the same start, the same averaged gradient, the same AdamW state). Rank 0 alone writes the
run folder and, in ``crl`` mode, owns the experience bank and the extractor (see ``crl_agent.train``).

:class:`Distributed` wraps the few collectives the trainer needs; with one process (no torchrun) every
method is a cheap no-op, so the trainer has a single code path.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

# held-out evaluations and the extractor's update run on some ranks while others wait at the next
# collective: on a CPU that can take far longer than the default 30-minute timeout
TIMEOUT = datetime.timedelta(hours=6)


# where each launcher says this process's place: torchrun (and accelerate, which runs it) first, then MPI
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")
WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")


def _env_int(names: Sequence[str], default: int) -> int:
    """The first of ``names`` set in the environment, as an int (``default`` if none is)."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                raise RuntimeError(f"{name}={value!r} is not an integer") from None
    return default


def _launch_env() -> str:
    """The launcher variables that are set, for error messages."""
    names = (*RANK_VARS, *WORLD_VARS, *LOCAL_RANK_VARS)
    return ", ".join(f"{n}={os.environ[n]}" for n in names if n in os.environ) or "no launcher variables"


class Distributed:
    """The process group of a ``torchrun`` launch, or a world of one.

    Attributes:
        rank, world, local_rank: this process's place (0, 1, 0 without torchrun).
        device: where this rank trains: ``cuda`` becomes ``cuda:<local_rank>`` under torchrun.
    """

    def __init__(self, device: str = "cpu"):
        self.world = _env_int(WORLD_VARS, 1)
        self.rank = _env_int(RANK_VARS, 0)
        self.local_rank = _env_int(LOCAL_RANK_VARS, 0)
        self.device = device
        self._own_group = False
        if self.world == 1:
            return
        if not 0 <= self.rank < self.world:
            raise RuntimeError(f"rank {self.rank} is outside a world of {self.world} processes ({_launch_env()})")
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing and not dist.is_initialized():
            raise RuntimeError(f"a launch of {self.world} processes ({_launch_env()}) needs {' and '.join(missing)} "
                               "for the rendezvous: torchrun and accelerate set them; under mpirun export them "
                               "(e.g. -x MASTER_ADDR=<rank 0 host> -x MASTER_PORT=29500)")
        if device == "cuda":
            self.device = f"cuda:{self.local_rank}"
        cuda = self.device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(torch.device(self.device))
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo", rank=self.rank, world_size=self.world,
                                    timeout=TIMEOUT)
            self._own_group = True
        if dist.get_world_size() != self.world:
            raise RuntimeError(f"WORLD_SIZE={self.world} but the process group has {dist.get_world_size()} ranks")

    @property
    def main(self) -> bool:
        """Whether this is rank 0 (the one that logs, checkpoints and owns the bank)."""
        return self.rank == 0

    def share(self, n: int) -> list[int]:
        """The indices of ``range(n)`` this rank takes (round robin)."""
        return list(range(self.rank, n, self.world))

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (any picklable object)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def reduce_gradients(self, params: Sequence[torch.Tensor], weight: float, flags: Sequence[float] = ()) -> list[float]:
        """Replace each rank's gradients by the weighted mean over ranks, ``sum_r w_r g_r / sum_r w_r``.

        ``weight`` is what this rank's loss averaged over (its rows, episodes or tokens), so the result
        is the gradient of the loss over every rank's samples as one batch. A rank with nothing to
        train on passes ``weight=0`` (its gradient counts for nothing but it joins the collective, so
        no rank waits forever). ``flags`` are summed over ranks and returned (e.g. how many ranks had a
        non-finite loss), so every rank takes the same decision after the update.
        """
        head = torch.tensor([float(weight), *map(float, flags)], dtype=torch.float64)
        if self.world == 1:
            return head[1:].tolist()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        device = grads[0].device if grads else torch.device("cpu")
        flat = torch.cat([g.detach().reshape(-1).float() for g in grads]) * float(weight)
        head = head.to(device)
        dist.all_reduce(head)
        dist.all_reduce(flat)
        total = float(head[0])
        if total > 0:
            flat /= total
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            part = flat[offset: offset + n].view_as(g).to(g.dtype)
            if p.grad is None:
                p.grad = part.clone()
            else:
                p.grad.copy_(part)
            offset += n
        return head[1:].tolist()

    def same_weights(self, params: Sequence[torch.Tensor]) -> bool:
        """Whether every rank holds these parameters bit for bit (a check, e.g. after a resume)."""
        if self.world == 1:
            return True
        h = hashlib.sha256()
        for p in params:
            h.update(p.detach().float().cpu().numpy().tobytes())  # float32 holds bf16 and fp16 values exactly
        return len(set(self.gather(h.hexdigest()))) == 1

    def broadcast_parameters(self, params: Sequence[torch.Tensor]) -> None:
        """Rank 0's values of ``params`` on every rank (the LoRA matrices start random)."""
        if self.world == 1:
            return
        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, src=0)

    def close(self) -> None:
        if self._own_group and dist.is_initialized():
            dist.destroy_process_group()
            self._own_group = False
