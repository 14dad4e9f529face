"""The dtype an engine on a CPU computes in: the model's own only where the CPU does bf16 natively.

vLLM's ``auto`` takes the checkpoint's dtype: bf16 for the local models and most published ones. A CPU
without native bf16 arithmetic (x86 AVX512_BF16 or AMX, Arm's BF16) emulates it. On an AVX2-only EPYC, a
bf16 matmul of the bench model's shapes ran 50-80x slower than float32, and vLLM's steps 4-6x slower
(docs/configuration.md). There ``auto`` means float32; an explicit dtype is always kept, and GPUs keep ``auto``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 flags; Arm's "Features" name


def cpuinfo_field(names: tuple[str, ...], cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first CPU's value of the first of ``names`` in ``cpuinfo``; None where absent or unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in names:
            return value.strip()
    return None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first CPU's feature flags (x86 ``flags``, Arm ``Features``); empty where unreadable."""
    return frozenset((cpuinfo_field(("flags", "Features"), cpuinfo) or "").split())


def engine_dtype(requested: str, on_cpu: bool, flags: Iterable[str]) -> str:
    """``requested``, except ``auto`` on a CPU without native bf16, which becomes ``float32``."""
    if requested != "auto" or not on_cpu or NATIVE_BF16.intersection(flags):
        return requested
    return "float32"
