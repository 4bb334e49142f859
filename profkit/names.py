"""Names every stage reads the same way (the simulator writes them as nsys would, the analyzers
label with them): a GPU kernel's short name, which kernels communicate, which runtime calls block."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profkit import distinct

ANONYMOUS_NAMESPACE = "(anonymous namespace)::"


def kernel_short_name(name: str, keep_anonymous: bool = True) -> str:
    """The function name of a demangled kernel, as nsys's ``shortName``: no ``void``, namespaces,
    template or argument lists (``void at::native::foo<float>(...)`` -> ``foo``); may be empty, and
    keeps a space that stood before the cut (``Memcpy DtoH (...)`` -> ``Memcpy DtoH ``).

    ``keep_anonymous=False`` drops ``(anonymous namespace)::`` first, so the name inside one
    survives the cut at ``(`` (what the collective names of ``analyze.overhead_names`` want; the
    straggler phase labels and the simulator's nsys names have always kept it).
    """
    s = name.strip()
    s = s[5:] if s.startswith("void ") else s
    if not keep_anonymous:
        s = s.replace(ANONYMOUS_NAMESPACE, "")
    for stop in ("<", "("):
        i = s.find(stop)
        if i > 0:
            s = s[:i]
    return s.rsplit("::", 1)[-1]


# NCCL/RCCL, DeepEP, vLLM custom all-reduce and symmetric-memory kernels are communication
COMM_KERNEL_RE = re.compile(
    r"nccl|rccl|dpsk::ep|deep_ep|deepep|cross_device_reduce|multimem_all_reduce|one_shot_all_reduce"
    r"|two_shot_all_reduce|all_reduce_kernel|allreduce|alltoall|all_to_all|allgather|reducescatter",
    re.IGNORECASE,
)


def is_comm_kernel(names: pd.Series) -> np.ndarray:
    """True for kernels that move data between GPUs (matched on the kernel name; each distinct
    name is tested once)."""
    return distinct.contains(names, COMM_KERNEL_RE)


# CUDA/HIP runtime calls that block the host until the GPU is done (SYNC_RE), and the queries a
# busy-polling loop repeats (POLL_RE): read by the host-activity causes and by the sync-point evidence
SYNC_RE = re.compile(
    r"^(?:cuda|hip)(?:Stream|Device|Event)Synchronize|^cu(?:Stream|Ctx|Event)Synchronize"
    r"|^(?:cuda|hip)Memcpy(?:2D|3D)?(?:FromSymbol|ToSymbol)?$|^cuMemcpy(?:DtoH|HtoD|DtoD)?(?:_v2)?$",
    re.I,
)
POLL_RE = re.compile(r"^(?:cuda|cu|hip)(?:EventQuery|StreamQuery)$", re.I)
