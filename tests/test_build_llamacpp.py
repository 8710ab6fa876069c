"""scripts/build_llamacpp.py: the CMake patch that links the llguidance wheel, and the CPU options it builds for.

The build itself (5 minutes) is not run here; docs/engines.md records the build it made and the engine tests it
passed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_llamacpp.py"
spec = importlib.util.spec_from_file_location("build_llamacpp", SCRIPT)
assert spec is not None and spec.loader is not None
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)

# llama.cpp's common/CMakeLists.txt around its llguidance option, as in xllamacpp 2026.10's sources
COMMON = """target_link_libraries(${TARGET} PRIVATE cpp-httplib)

if (LLAMA_LLGUIDANCE)
    include(ExternalProject)
    ExternalProject_Add(llguidance_ext
        GIT_REPOSITORY https://github.com/guidance-ai/llguidance
        BUILD_COMMAND cargo build --release --package llguidance
    )
    target_compile_definitions(${TARGET} PUBLIC LLAMA_USE_LLGUIDANCE)
    target_link_libraries(${TARGET} PRIVATE llguidance)
    if (WIN32)
        target_link_libraries(${TARGET} PRIVATE ws2_32 userenv ntdll bcrypt)
    endif()
endif()

target_link_libraries(${TARGET} PUBLIC llama Threads::Threads)
"""


def test_the_patch_links_the_wheels_library_instead_of_building_llguidance(tmp_path: Path) -> None:
    cmake = tmp_path / "thirdparty/llama.cpp/common/CMakeLists.txt"
    cmake.parent.mkdir(parents=True)
    cmake.write_text(COMMON)
    library = Path("/venv/site-packages/llguidance/_lib.abi3.so")
    build.patch_llguidance(tmp_path, library)
    patched = cmake.read_text()
    assert "ExternalProject" not in patched and "GIT_REPOSITORY" not in patched and "WIN32" not in patched
    assert "LLAMA_USE_LLGUIDANCE" in patched and "AGENTFLOW_LLGUIDANCE_LIBRARY" in patched
    # what surrounds the block is kept, once
    assert patched.startswith("target_link_libraries(${TARGET} PRIVATE cpp-httplib)\n\nif (LLAMA_LLGUIDANCE)")
    assert patched.endswith("endif()\n\ntarget_link_libraries(${TARGET} PUBLIC llama Threads::Threads)\n")
    assert patched.count("if (LLAMA_LLGUIDANCE)") == 1 and patched.count("endif()") == 1
    # xllamacpp links libllguidance.a from the build tree: a linker script naming the wheel's library
    stand_in = tmp_path / "thirdparty/llama.cpp/build/llguidance/libllguidance.a"
    assert stand_in.read_text() == f"INPUT({library})\n"


def test_a_source_without_the_llguidance_block_is_refused(tmp_path: Path) -> None:
    cmake = tmp_path / "thirdparty/llama.cpp/common/CMakeLists.txt"
    cmake.parent.mkdir(parents=True)
    cmake.write_text("target_link_libraries(${TARGET} PUBLIC llama)\n")
    with pytest.raises(SystemExit, match="no llguidance block"):
        build.patch_llguidance(tmp_path, Path("/lib.so"))


def test_the_build_uses_the_vector_extensions_the_cpu_lists_and_never_amx() -> None:
    avx512 = "processor: 0\nflags\t\t: fpu sse avx avx2 fma f16c bmi2 avx512f avx512_vnni avx512_bf16 amx_tile\n"
    options = build.cmake_args(avx512).split()
    assert "-DGGML_NATIVE=OFF" in options and "-DLLAMA_LLGUIDANCE=ON" in options
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX2=ON"} <= set(options)
    assert not any("AMX" in option for option in options)
    avx2 = build.cmake_args("flags\t\t: fpu sse avx avx2 fma f16c\n").split()
    assert "-DGGML_AVX2=ON" in avx2 and not any("AVX512" in option for option in avx2)
