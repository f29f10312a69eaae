"""All of a model's parameters as views into one contiguous float32 vector.

GASLoC treats θ as one vector: the wire streams it in chunks, the mixing averages it, the
outer step writes it in place. Keeping the parameters as views into one buffer makes each
of those a single tensor operation with no gather/scatter copies, and guarantees that what
was sent is exactly what the model computes with. In-place updates through either side are
visible to the other: ``optimizer.step()`` on the parameters changes ``flat``, and
``flat.copy_(...)`` changes the model.

The views survive anything that updates parameters in place (optimizers, ``load_state_dict``
without ``assign``, ``flat.copy_``). They are broken by anything that replaces a
parameter's storage (``model.to(other_device)``, ``p.data = ...``); :meth:`FlatParameters.check`
detects that.
"""

from __future__ import annotations

import hashlib
import logging

import torch
from torch import nn

log = logging.getLogger(__name__)


class FlatParameters:
    """Make every unique parameter of ``model`` (tied ones once) a view into ``self.flat``.

    Parameter objects keep their identity, so an optimizer built before or after this keeps
    working on the same tensors. Every parameter becomes float32: the vector is what peers
    exchange and mix, and mixing in a lower precision would bias the network mean.
    """

    def __init__(self, model: nn.Module) -> None:
        params = list(model.named_parameters())  # de-duplicates tied parameters
        if not params:
            raise ValueError("model has no parameters to flatten")
        device = params[0][1].device
        for name, p in params:
            if p.device != device:
                raise ValueError(
                    f"parameter {name} is on {p.device}, others on {device}: "
                    "move the model to one device before flattening"
                )
            if not p.is_floating_point():
                raise ValueError(f"parameter {name} has dtype {p.dtype}; expected floating point")
        self.names: list[str] = [name for name, _ in params]
        self.shapes: list[torch.Size] = [p.shape for _, p in params]
        self.offsets: list[int] = []
        total = 0
        for _, p in params:
            self.offsets.append(total)
            total += p.numel()
        self.numel: int = total
        self.flat: torch.Tensor = torch.empty(total, dtype=torch.float32, device=device)
        self._params: list[nn.Parameter] = [p for _, p in params]
        with torch.no_grad():
            for p, a in zip(self._params, self.offsets, strict=True):
                b = a + p.numel()
                self.flat[a:b].copy_(p.reshape(-1))
                p.data = self.flat[a:b].view_as(p)
        log.debug("flattened %d parameters, %d values", len(params), total)

    @property
    def nbytes(self) -> int:
        """Size of the vector in bytes (float32), e.g. for bandwidth estimates."""
        return self.numel * self.flat.element_size()

    def load_(self, tensor: torch.Tensor) -> None:
        """Overwrite θ in place with ``tensor`` (1-D, ``numel`` values; cast to float32)."""
        if tensor.shape != self.flat.shape:
            raise ValueError(
                f"cannot load a tensor of shape {tuple(tensor.shape)} into flat parameters "
                f"of shape ({self.numel},)"
            )
        with torch.no_grad():
            self.flat.copy_(tensor)

    def clone(self) -> torch.Tensor:
        """A detached copy of θ, independent of later training."""
        return self.flat.detach().clone()

    def check(self) -> None:
        """Raise RuntimeError if any parameter no longer views into ``flat``.

        Cheap (pointer comparisons); call it after anything that might have re-allocated
        parameters, since a broken view would silently send stale θ to peers.
        """
        base = self.flat.data_ptr()
        size = self.flat.element_size()
        for name, p, a in zip(self.names, self._params, self.offsets, strict=True):
            if p.data_ptr() != base + a * size or p.dtype != self.flat.dtype:
                raise RuntimeError(f"parameter {name} is no longer a view into the flat vector")


def model_fingerprint(model: nn.Module, spec: str) -> str:
    """A 16-hex-digit sha256 of the spec and each parameter's name, shape and dtype, in order.

    Peers compare fingerprints before exchanging θ: equal fingerprints mean the flat
    vectors have the same layout. Values are left out on purpose (they change every step);
    so is anything process-specific, so identical models agree across machines. Compute
    it after :class:`FlatParameters` (which makes every parameter float32), as every peer
    does, so a lower-precision factory model fingerprints the same everywhere.
    """
    h = hashlib.sha256()
    h.update(f"gaslocd-model-v1\0{spec}\0".encode())
    for name, p in model.named_parameters():
        h.update(f"{name}\0{tuple(p.shape)}\0{p.dtype}\0".encode())
    return h.hexdigest()[:16]
