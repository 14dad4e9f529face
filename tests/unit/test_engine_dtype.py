"""An engine on a CPU without native bf16 computes in float32 (replicas/engine_dtype.py)."""

from __future__ import annotations

from pathlib import Path

from replicas.engine_dtype import cpu_flags, engine_dtype

AVX2_EPYC = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx fma avx2\n\nprocessor\t: 1\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def _flags(tmp_path: Path, text: str) -> frozenset[str]:
    (tmp_path / "cpuinfo").write_text(text)
    return cpu_flags(tmp_path / "cpuinfo")


def test_auto_on_a_cpu_without_native_bf16_is_float32(tmp_path: Path) -> None:
    assert engine_dtype("auto", on_cpu=True, flags=_flags(tmp_path, AVX2_EPYC)) == "float32"


def test_auto_stays_where_the_cpu_does_bf16(tmp_path: Path) -> None:
    assert engine_dtype("auto", on_cpu=True, flags=_flags(tmp_path, SAPPHIRE_RAPIDS)) == "auto"
    assert engine_dtype("auto", on_cpu=True, flags=_flags(tmp_path, GRAVITON3)) == "auto"


def test_an_explicit_dtype_and_a_gpu_keep_theirs(tmp_path: Path) -> None:
    flags = _flags(tmp_path, AVX2_EPYC)
    assert engine_dtype("bfloat16", on_cpu=True, flags=flags) == "bfloat16"
    assert engine_dtype("auto", on_cpu=False, flags=flags) == "auto"


def test_unreadable_cpuinfo_means_no_flags(tmp_path: Path) -> None:
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert engine_dtype("auto", on_cpu=True, flags=frozenset()) == "float32"
