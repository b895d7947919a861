#!/usr/bin/env python3
"""A CUDA build without NCCL (CMakeLists.txt: NCCL not found, or
-DKVS_WITH_NCCL=OFF) must still configure and link: src/dist/nccl_absent.cpp
then stands in for src/dist/nccl_comm.cpp. A whole second CUDA build is too
slow for CI, so this configures one, compiles the stand-in alone, and checks
that it defines every external function the real communicator defines (a
missing one would only show at that build's link, on a GPU machine)."""
import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path


def defined_functions(obj: Path) -> set:
    out = subprocess.run(["nm", "-C", "-g", "--defined-only", str(obj)], check=True, capture_output=True,
                         text=True).stdout
    return {line.split(" ", 2)[2] for line in out.splitlines() if re.match(r"^\S+ T ", line)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True, help="the main (NCCL) build directory")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    work = Path(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    cfg = subprocess.run(["cmake", "-S", a.source, "-B", str(work), "-DCMAKE_BUILD_TYPE=Release", "-DKVS_CUDA=ON",
                          "-DKVS_WITH_NCCL=OFF"], capture_output=True, text=True)
    if cfg.returncode != 0:
        print(cfg.stdout[-3000:], cfg.stderr[-3000:])
        print("FAIL: configuring without NCCL failed")
        return 1
    if "kvshift: NCCL OFF" not in cfg.stdout:
        print(cfg.stdout[-3000:])
        print("FAIL: the configure output does not say 'kvshift: NCCL OFF'")
        return 1
    if "KVS_BUILT_WITH_NCCL:INTERNAL=OFF" not in (work / "CMakeCache.txt").read_text():
        print("FAIL: CMakeCache.txt lacks KVS_BUILT_WITH_NCCL=OFF (scripts/gpu_check.sh reads it)")
        return 1
    # The real communicator must not be compiled there: make knows no rule for its object.
    real = subprocess.run(["make", "-C", str(work), "src/dist/nccl_comm.cpp.o"], capture_output=True, text=True)
    if real.returncode == 0 and (work / "CMakeFiles/kvs_lib.dir/src/dist/nccl_comm.cpp.o").exists():
        print("FAIL: the build without NCCL compiles src/dist/nccl_comm.cpp")
        return 1
    for src in ("src/dist/nccl_absent.cpp.o", "src/dist/gpu_device.cpp.o"):
        r = subprocess.run(["make", "-C", str(work), src], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:])
            print(f"FAIL: {src} does not compile without NCCL")
            return 1
    stub = defined_functions(work / "CMakeFiles/kvs_lib.dir/src/dist/nccl_absent.cpp.o")
    nccl = defined_functions(Path(a.build) / "CMakeFiles/kvs_lib.dir/src/dist/nccl_comm.cpp.o")
    missing = sorted(nccl - stub)
    print(f"nccl_comm.cpp defines {len(nccl)} external functions; nccl_absent.cpp {len(stub)}")
    if not nccl or missing:
        print("FAIL: nccl_absent.cpp lacks:\n  " + "\n  ".join(missing) if missing else "FAIL: nothing found in nccl_comm.cpp.o")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("ok: the build without NCCL configures, and its stand-in defines every function nccl_comm.cpp does")
    return 0


if __name__ == "__main__":
    sys.exit(main())
