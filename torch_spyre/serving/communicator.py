"""vLLM's device communicator for spyre tensors: tensor-parallel collectives between simulated cards.

Each TP rank is a vLLM worker process with its own card (``spyre:<local rank>``, ``worker.py``). gloo cannot
take PrivateUse1 tensors, so every collective goes through ``device/collectives.py`` on vLLM's CPU (gloo)
group: the values travel as host copies (not charged), the time is the card-to-card link's (PCIe peer to peer,
``card/interconnect.py``), charged on each card taking part.
"""

from __future__ import annotations

import torch

from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase

from torch_spyre.device import collectives

PP_REFUSED = ("spyre serves tensor parallel only: card-to-card send/recv (pipeline parallel) is not modeled; use "
              "--pipeline-parallel-size 1")


def _dim(t: torch.Tensor, dim: int) -> int:
    return dim + t.dim() if dim < 0 else dim


class SpyreCommunicator(DeviceCommunicatorBase):
    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        return collectives.all_reduce(input_, self.cpu_group)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return collectives.all_gather(input_, _dim(input_, dim), self.cpu_group)

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        return collectives.gather(input_, dst, _dim(input_, dim), self.cpu_group)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return collectives.reduce_scatter(input_, _dim(input_, dim), self.cpu_group)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        return collectives.broadcast(tensor, src, self.cpu_group)

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        raise NotImplementedError(PP_REFUSED)

    def recv(self, size: torch.Size, dtype: torch.dtype, src: int | None = None) -> torch.Tensor:
        raise NotImplementedError(PP_REFUSED)
