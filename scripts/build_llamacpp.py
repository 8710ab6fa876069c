"""Rebuild the embedded llama.cpp engine (`xllamacpp`) from source for this CPU, with llguidance.

The `xllamacpp` wheel on PyPI is compiled for AVX2. On a CPU with AVX-512 a build for the CPU's own vector
units decodes faster (docs/engines.md has the measurements). The package's own source build fetches
llguidance, the grammar engine that the trainer's llama.cpp rollouts need, from its Git host and compiles it
with cargo, which an offline machine (or one without Rust) cannot do. The `llguidance` wheel that agentflow
already installs (for the transformers engine) exports the same C API (`llg_*`), so this script builds
llama.cpp against that library instead:

1. downloads the source distributions of the installed `xllamacpp` (to build) and `llguidance` (for its C
   header) from a package index;
2. points llama.cpp's llguidance option at the installed wheel's library and header (a small CMake patch);
3. compiles with the CPU's vector extensions (AVX-512 and its VNNI/BF16/VBMI parts when /proc/cpuinfo lists
   them; AMX stays off: a KVM guest here lists it but dies with an illegal instruction) and reinstalls
   `xllamacpp` into the running environment;
4. checks that the new build loads and lists its CPU features.

    python scripts/build_llamacpp.py [--work /tmp/xllamacpp-build] [--index https://pypi.org/simple]

Needs cmake and a C++ compiler (Debian: `apt install cmake g++`); about 5 minutes on 2 cores. The new
`xllamacpp` loads llguidance's library by its absolute path: reinstalling or upgrading `llguidance` breaks
`import xllamacpp` until this script runs again; `pip install --force-reinstall xllamacpp==VERSION` returns to
the wheel.
"""

from __future__ import annotations

import argparse
import html.parser
import importlib.metadata
import logging
import os
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import llguidance

log = logging.getLogger("build_llamacpp")

CPU_OPTIONS = {  # /proc/cpuinfo flag -> ggml's CMake option
    "avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C", "bmi2": "GGML_BMI2",
    "avx_vnni": "GGML_AVX_VNNI", "avx512f": "GGML_AVX512", "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16",
}
LLGUIDANCE_BLOCK = """if (LLAMA_LLGUIDANCE)
    # agentflow scripts/build_llamacpp.py: the installed llguidance wheel's C API instead of a cargo build
    target_compile_definitions(${TARGET} PUBLIC LLAMA_USE_LLGUIDANCE)
    target_include_directories(${TARGET} PRIVATE "$ENV{AGENTFLOW_LLGUIDANCE_INCLUDE}")
    # passed to the linker as a file: CMake would turn a library not named lib*.so into a `-l` search
    target_link_libraries(${TARGET} PRIVATE "-Wl,$ENV{AGENTFLOW_LLGUIDANCE_LIBRARY}")
endif()
"""


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.hrefs += [value for name, value in attrs if tag == "a" and name == "href" and value]


def sdist(project: str, version: str, index: str, work: Path) -> Path:
    """Download and unpack `project`'s source distribution of `version` from a PEP 503 index. (`pip download`
    cannot: it prepares the metadata, and llguidance's build backend needs cargo for that.)"""
    name = f"{project}-{version}.tar.gz"
    page = f"{index.rstrip('/')}/{project}/"
    with urllib.request.urlopen(page, timeout=60) as reply:
        links = _Links()
        links.feed(reply.read().decode())
    urls = [urllib.request.urljoin(page, href) for href in links.hrefs if href.split("#")[0].endswith(name)]
    if not urls:
        raise SystemExit(f"{page} lists no {name}")
    archive = work / name
    urllib.request.urlretrieve(urls[0].split("#")[0], archive)
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    return work / name.removesuffix(".tar.gz")


def patch_llguidance(source: Path, library: Path) -> None:
    """Replace llama.cpp's llguidance block (git download + cargo build) by `library`, the installed wheel's."""
    cmake = source / "thirdparty/llama.cpp/common/CMakeLists.txt"
    text = cmake.read_text()
    if "if (LLAMA_LLGUIDANCE)" not in text or "if (WIN32)" not in text:
        raise SystemExit(f"{cmake} has no llguidance block of the layout this script patches: update the script")
    start = text.index("if (LLAMA_LLGUIDANCE)")
    inner = text.index("if (WIN32)", start)
    end = text.index("endif()\n", text.index("endif()\n", inner) + 1) + len("endif()\n")
    cmake.write_text(text[:start] + LLGUIDANCE_BLOCK + text[end:])
    # xllamacpp links the archives it finds in llama.cpp's build tree; a linker script in the archive's place
    # makes that link name the shared library.
    stand_in = source / "thirdparty/llama.cpp/build/llguidance/libllguidance.a"
    stand_in.parent.mkdir(parents=True, exist_ok=True)
    stand_in.write_text(f"INPUT({library})\n")


def cmake_args(cpuinfo: str) -> str:
    """llama.cpp's CMake options for the CPU that `cpuinfo` (the text of /proc/cpuinfo) describes."""
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    options = [f"-D{option}=ON" for flag, option in CPU_OPTIONS.items() if flag in flags]
    return " ".join(["-DGGML_NATIVE=OFF", "-DLLAMA_LLGUIDANCE=ON", "-DLLAMA_BUILD_BORINGSSL=OFF",
                     # the server executable is built too; it links the same Python-extension library
                     "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined", *options])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/xllamacpp-build"))
    parser.add_argument("--index", default="https://pypi.org/simple")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    library = next(Path(llguidance.__file__).parent.glob("_lib*.so"), None)
    if library is None:
        raise SystemExit(f"no compiled library beside {llguidance.__file__}: reinstall the llguidance wheel")
    xllamacpp_version = importlib.metadata.version("xllamacpp")
    header = sdist("llguidance", importlib.metadata.version("llguidance"), args.index, args.work)
    os.environ.update(AGENTFLOW_LLGUIDANCE_LIBRARY=str(library.resolve()),
                      AGENTFLOW_LLGUIDANCE_INCLUDE=str(header / "parser"),
                      CMAKE_ARGS=cmake_args(Path("/proc/cpuinfo").read_text()),
                      CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    source = sdist("xllamacpp", xllamacpp_version, args.index, args.work)
    patch_llguidance(source, library.resolve())
    log.info("building xllamacpp %s with CMAKE_ARGS=%s", xllamacpp_version, os.environ["CMAKE_ARGS"])
    subprocess.run([sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(source)],
                   check=True)
    # a fresh interpreter loads the new build (this one may hold the old library)
    code = "import sys, xllamacpp; sys.stdout.write(xllamacpp.get_system_info())"
    check = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    log.info("the new build loads: %s", check.stdout.strip())


if __name__ == "__main__":
    main()
