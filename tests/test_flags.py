"""Switches from the environment read "off" one way (``profkit.flags``)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "profkit"


def test_every_switch_reads_off_one_way(monkeypatch):
    """``profkit.flags.env_on``: the cache, GC spans, NVTX ranges and the allocator switches all
    read "off" alike (any case, spaces around), and unset or empty is their default."""
    from profkit.flags import env_on
    from profkit.ingest import cache
    from profkit.instrument import nvtx_ranges

    for off in ("0", "false", "No", " OFF "):
        monkeypatch.setenv("PROFKIT_CACHE", off)
        monkeypatch.setenv("PROFKIT_NVTX", off)
        assert not cache.enabled() and not nvtx_ranges.enabled_by_env() and not env_on("PROFKIT_CACHE")
    for on in ("1", "yes", "true", "anything"):
        monkeypatch.setenv("PROFKIT_CACHE", on)
        assert cache.enabled() and env_on("PROFKIT_CACHE", default=False)
    monkeypatch.setenv("PROFKIT_CACHE", "")
    assert cache.enabled() and not env_on("PROFKIT_CACHE", default=False)
    monkeypatch.delenv("PROFKIT_CACHE")
    assert cache.enabled()
    uses = [p for p in ROOT.rglob("*.py") if p.name != "flags.py" and '"false", "no", "off"' in p.read_text()]
    assert not uses, f"switches parsed by hand again: {uses}"
