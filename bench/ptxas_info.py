#!/usr/bin/env python3
"""Registers, spills and (optionally) the CUBIN of one kernel module, compiled here.

No GPU needed: NVRTC's ptxas reports each kernel's registers, stack and spills
(`--ptxas-options=-v`) for sm_90a with the options the device build uses
(context.rs `options`). NVRTC and the SASS tools come from PyPI wheels:

    pip download "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-cuobjdump==13.*" nvidia-cuda-nvdisasm \
        --no-deps -d /tmp/nv && (cd /tmp/nv && for w in *.whl; do python3 -m zipfile -e $w x; done)
    JET_NVRTC_LIB=/tmp/nv/x/nvidia/cu13/lib/libnvrtc.so.13 [JET_NVRTC_DEFINES="NAME=1"] \
        python3 bench/ptxas_info.py flash 'fa_dec2_qkv' [/tmp/flash.cubin]
    # SASS of one kernel (cuobjdump finds nvdisasm on PATH):
    PATH=/tmp/nv/x/nvidia/cu13/bin:$PATH cuobjdump -sass -fun sample_chunks /tmp/sample.cubin

(`LD_LIBRARY_PATH=/tmp/nv/x/nvidia/cu13/lib cargo test -p jet-kernels --test
cuda_parity kernel_sources_compile` compiles every module the same way.)

Take the device's NVRTC (13.0 on the GPU machines): 13.5 compiled a generic
lambda in device code that 13.0 rejects ("host functions are not allowed in JIT
mode"), which cost a device call (forty-second session). Compiler warnings are
printed too (e.g. ptxas serialising wgmma, C7514 / C7518).
"""
import ctypes
import os
import re
import sys

CUDA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "src", "cuda")


def modules():
    """Each module's files after common.cuh, read from context.rs's `Source`s."""
    text = open(os.path.join(CUDA, "context.rs")).read()
    mods = {}
    for m in re.finditer(r'Source\s*=\s*Source\s*\{\s*name:\s*"(\w+)",\s*code:(.*?)\};', text, re.S):
        mods[m.group(1)] = re.findall(r'include_str!\("(kernels/[\w.]+)"\)', m.group(2))
    return mods


def main():
    mods = modules()
    if len(sys.argv) < 2 or sys.argv[1] not in mods:
        sys.exit(f"usage: ptxas_info.py MODULE [KERNEL_REGEX] [CUBIN_OUT]; modules: {', '.join(mods)}")
    name = sys.argv[1]
    pat = sys.argv[2] if len(sys.argv) > 2 else "."
    lib = ctypes.CDLL(os.environ.get("JET_NVRTC_LIB", "libnvrtc.so.13"))
    read = lambda f: open(os.path.join(CUDA, f)).read()
    src = read("kernels/common.cuh") + "\n" + "".join(read(f) for f in mods[name])
    prog = ctypes.c_void_p()
    lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None)
    opts = [b"--gpu-architecture=sm_90a", b"-std=c++17", b"--fmad=false", b"--ptxas-options=-v"]
    # The runtime's variant switch (context.rs): JET_NVRTC_DEFINES="NAME NAME=1".
    opts += [b"-D" + d.encode() for d in os.environ.get("JET_NVRTC_DEFINES", "").split()]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    cur = None
    for line in log.value.decode().splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = m.group(1)
        if (rc != 0 and "error" in line) or "warning" in line:
            print(line)
        if cur and re.search(pat, cur) and ("Used" in line or "spill" in line):
            print(cur, "|", line.split("info    :")[-1].strip())
    if rc != 0:
        sys.exit(f"NVRTC could not compile {name} (rc {rc})")
    if len(sys.argv) > 3:
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetCUBIN(prog, buf)
        open(sys.argv[3], "wb").write(buf.raw)


if __name__ == "__main__":
    main()
