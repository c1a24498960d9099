"""Device names checked once, for `mmreward.load`, `Reward.to` and `mmreward.media.to_batch` alike."""

from __future__ import annotations

import torch

from mmreward.errors import DeviceError


def check_device(device: str | torch.device | int | None) -> torch.device:
    """A device torch knows and this machine has; None or "auto" -> cuda when available, else cpu."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hint = "use 'cpu', 'cuda', 'cuda:N' or 'mps' (or None for the default)"
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise DeviceError(f"device: {device!r} is not a device; {hint}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise DeviceError(f"device: {device!r} is not a device; {hint}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device '{device}' requested but CUDA is not available here; use device='cpu'")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceError(
                f"device '{device}': this machine has {count} CUDA device(s) (cuda:0 to cuda:{count - 1}); "
                "pick one of those, or set CUDA_VISIBLE_DEVICES"
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"device '{device}' requested but MPS is not available here; use device='cpu'")
    elif dev.type not in ("cpu", "meta"):
        backend = getattr(torch, dev.type, None)  # xpu, hpu, ... expose is_available() like cuda
        if backend is None or (hasattr(backend, "is_available") and not backend.is_available()):
            raise DeviceError(f"device '{device}' requested but {dev.type} is not available here; {hint}")
    return dev
