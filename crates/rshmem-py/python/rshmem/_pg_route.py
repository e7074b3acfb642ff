"""Per-device backend strings (``init_process_group("cpu:gloo,cuda:rshmem")``): which backend
serves each device type of an rshmem process group.

torch makes a group of several backends only from C++ backends; a Python ``ProcessGroup`` (what
the "rshmem" backend is) replaces the whole group. So the rshmem group routes by itself: a call
whose first tensor is on a device type that the group's backend string gives to another backend
(gloo, nccl) goes to a backend of that name which the group makes at the first such call
(collective, as every call is: every rank makes it at the same call), over the group's ranks and
store; every other call is rshmem's. Calls without tensors (``barrier``) are rshmem's, except
on a group of some of the world's ranks (which rshmem cannot serve), where they go to the other
backend where there is one.
"""

from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from .dist import BACKEND

# The calls of torch's ProcessGroup that a group routes (their arguments as torch passes them,
# forwarded unchanged to the backend of the tensors' device type).
CALLS = (
    "allreduce", "reduce", "broadcast", "allgather", "_allgather_base", "reduce_scatter",
    "_reduce_scatter_base", "alltoall_base", "alltoall", "barrier", "send", "recv",
    "recv_anysource", "gather", "scatter", "allreduce_coalesced", "allgather_coalesced",
    "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced", "monitored_barrier",
)


def first_tensor(args: Any) -> Optional[torch.Tensor]:
    """The first tensor among a call's arguments (tensors, lists of them, lists of lists)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)):
            t = first_tensor(a)
            if t is not None:
                return t
    return None


def device_map(config: str) -> Dict[str, str]:
    """``"cpu:gloo,cuda:rshmem"`` (as ``dist.get_backend_config`` gives it) as a dict."""
    out = {}
    for pair in config.split(","):
        dev, _, name = pair.strip().partition(":")
        if name:
            out[dev] = name.lower()
    return out


class Router:
    """The routes of one group: device type -> the backend serving it where that is not rshmem,
    made at its first call. ``group`` is the Python group (torch files the backend string under
    it once the group is made, so routes are looked up at the first call, not before)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Any,
                 tensorless_elsewhere: bool = False) -> None:
        self._store = store
        self._tensorless_elsewhere = tensorless_elsewhere
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._map: Optional[Dict[str, str]] = None
        self._made: Dict[str, Any] = {}

    def devices(self, group: Any, also: Optional[str] = None) -> List[str]:
        """The device types that the group's backend string gives to other backends, and
        ``also`` (the device rshmem serves) first where the string gives it to rshmem or
        before torch filed the string."""
        m = self._device_map(group)
        if m is None:
            return [also] if also else []
        out = [also] if also and m.get(also, BACKEND) == BACKEND else []
        return out + [d for d, name in m.items() if name != BACKEND and d not in out]

    def _device_map(self, group: Any) -> Optional[Dict[str, str]]:
        if self._map is None:
            try:
                self._map = device_map(dist.get_backend_config(group))
            except Exception:  # noqa: BLE001 - not filed yet (the group is being made)
                return None
        return self._map

    def backend(self, group: Any, device_type: Optional[str]) -> Any:
        """The backend serving ``device_type`` if the backend string gives it to another
        backend than rshmem, else None (rshmem serves it, or refuses it)."""
        if device_type is None:
            if not self._tensorless_elsewhere:
                return None
            m = self._device_map(group) or {}
            others = [d for d, name in m.items() if name != BACKEND]
            if not others:
                return None
            device_type = "cpu" if "cpu" in others else others[0]
        b = self._made.get(device_type)
        if b is not None:
            return b
        m = self._device_map(group)
        name = m.get(device_type) if m is not None else None
        if name is None or name == BACKEND:
            return None
        b = self._made[device_type] = self._make(name, device_type)
        return b

    def _make(self, name: str, device_type: str) -> Any:
        store = dist.PrefixStore(f"rshmem-route/{device_type}/", self._store)
        if name == "gloo" and dist.is_gloo_available():
            b = dist.ProcessGroupGloo(store, self._rank, self._size, self._timeout)
        elif name == "nccl" and dist.is_nccl_available():
            opts = dist.ProcessGroupNCCL.Options()
            opts.is_high_priority_stream = False
            opts._timeout = self._timeout
            b = dist.ProcessGroupNCCL(store, self._rank, self._size, opts)
        else:
            raise NotImplementedError(
                f"backend string {device_type}:{name} with rshmem: the rshmem group routes "
                "other devices' tensors to gloo or nccl only"
            )
        b._set_sequence_number_for_group()
        return b

    def shutdown(self) -> None:
        made, self._made = list(self._made.values()), {}
        for b in made:
            b.shutdown()


def routed(cls: type) -> type:
    """Class decorator: each call of :data:`CALLS` that ``cls`` defines first asks its router
    (``self._router``) which backend serves its first tensor's device type."""
    for name in CALLS:
        fn = cls.__dict__.get(name)
        if fn is not None:
            setattr(cls, name, _wrap(name, fn))
    return cls


def _wrap(name: str, fn: Any) -> Any:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = first_tensor(args)
        b = self._router.backend(self, t.device.type if t is not None else None)
        if b is not None:
            return getattr(b, name)(*args, **kwargs)
        return fn(self, *args, **kwargs)

    call.__name__ = name
    call.__doc__ = fn.__doc__
    return call
