"""Collective facts from names and profiler args (shared by every reader).

Torch's ``record_param_comms`` names collectives its own way (``allreduce``,
``_allgather_base``, ``all_gather_into_tensor_coalesced``) and NCCL kernels carry
theirs in the kernel name (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``); analyses
match collectives across ranks and sources, so both map to one vocabulary.
"""
from __future__ import annotations

import re
from typing import Any

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
ALL_TO_ALL = "all_to_all"
BROADCAST = "broadcast"
SEND_RECV = "send_recv"

_ALIASES = {
    "allreduce": ALL_REDUCE,
    "allgather": ALL_GATHER,
    "reducescatter": REDUCE_SCATTER,
    "alltoall": ALL_TO_ALL,
    "all_to_allv": ALL_TO_ALL,
    "alltoallv": ALL_TO_ALL,
    "recvanysource": "recv",
    "sendrecv": SEND_RECV,
}
_SUFFIXES = ("_base", "_coalesced", "_into_tensor", "_tensor")

# NCCL/RCCL kernel names: ncclDevKernel_AllReduce_..., ncclKernel_SendRecv_..., ncclDevKernel_Generic
_NCCL_KERNEL = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")
_KERNEL_OPS = {
    "AllReduce": ALL_REDUCE,
    "AllGather": ALL_GATHER,
    "ReduceScatter": REDUCE_SCATTER,
    "AllToAll": ALL_TO_ALL,
    "Broadcast": BROADCAST,
    "Reduce": "reduce",
    "SendRecv": SEND_RECV,
    "Send": "send",
    "Recv": "recv",
}

# c10::ScalarType names as record_param_comms writes them ("Float", "BFloat16", ...).
DTYPE_BYTES = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "complexhalf": 4, "complexfloat": 8,
    "complexdouble": 16, "long": 8, "int": 4, "short": 2, "char": 1, "byte": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8, "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
}


def normalize_coll_name(raw: Any) -> str | None:
    """``_allgather_base`` -> ``all_gather``; unknown names are kept, lower-cased."""
    if raw is None:
        return None
    name = str(raw).strip().lower().lstrip("_")
    if not name:
        return None
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name = name[: -len(suffix)]
                changed = True
    return _ALIASES.get(name, name)


def coll_from_kernel(name: str) -> str | None:
    """Collective of an NCCL/RCCL kernel, from its name; None if not one (or ``Generic``)."""
    m = _NCCL_KERNEL.match(name)
    return _KERNEL_OPS.get(m.group(1)) if m else None


def dtype_bytes(dtype: Any) -> int | None:
    if not isinstance(dtype, str):
        return None
    key = dtype.rsplit("::", 1)[-1].lower()
    return DTYPE_BYTES.get(key)


def as_int(value: Any) -> int | None:
    """An integer from an int, an integral float, or a decimal string; else None."""
    if type(value) is int:
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in "+-":
            digits = text[1:]
        else:
            digits = text
        if digits.isdigit() and digits.isascii() and len(digits) <= 19:
            return int(text)
    return None


def coll_from_args(args: dict) -> tuple[str | None, str | None, int | None, int | None]:
    """(coll_name, coll_group, coll_seq, bytes) from record_param_comms args.

    Only called when ``Collective name`` is present: a plain ``Sequence number`` on a
    cpu_op is autograd's counter, not a collective's.
    """
    name = normalize_coll_name(args.get("Collective name"))
    group = args.get("Process Group Name")
    group = None if group is None else str(group)
    seq = args.get("Seq")
    if seq is None:
        seq = args.get("Sequence number")
    seq = as_int(seq)
    nelems = as_int(args.get("In msg nelems"))
    size = dtype_bytes(args.get("dtype"))
    nbytes = nelems * size if nelems is not None and size is not None else None
    return name, group, seq, nbytes
