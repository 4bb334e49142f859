"""Names every stage reads the same way (the simulator writes them as nsys would, the analyzers
label with them): a GPU kernel's short name."""
from __future__ import annotations

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
