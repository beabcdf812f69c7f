"""The standby benchmark's job: allocate device memory on the pod's card, touch it, hold it a
moment, free it (``benchmarks.gpu_standby``). Whatever the base image has does it: torch,
else cupy, else the CUDA runtime (``libcudart``) or driver (``libcuda``) through ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from typing import Any

MiB = 1024 * 1024


def _torch(size: int, hold_s: float) -> None:
    import torch

    if not torch.cuda.is_available():
        raise ImportError("torch has no CUDA here")
    block = torch.empty(size, dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    time.sleep(hold_s)
    del block
    torch.cuda.empty_cache()


def _cupy(size: int, hold_s: float) -> None:
    import cupy

    block = cupy.ones(size, dtype=cupy.uint8)
    cupy.cuda.Device().synchronize()
    time.sleep(hold_s)
    del block
    cupy.get_default_memory_pool().free_all_blocks()


def _load(*names: str) -> ctypes.CDLL:
    found = [n for n in names if n]
    for name in found:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise ImportError(f"none of {found} could be loaded")


def _check(what: str, code: int) -> None:
    if code != 0:
        raise RuntimeError(f"{what} failed with CUDA error {code}")


def _cudart(size: int, hold_s: float) -> None:
    lib = _load(ctypes.util.find_library("cudart") or "", "libcudart.so", "libcudart.so.12",
                "libcudart.so.11.0")  # fmt: skip
    ptr = ctypes.c_void_p()
    _check("cudaMalloc", lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size)))
    _check("cudaMemset", lib.cudaMemset(ptr, 1, ctypes.c_size_t(size)))
    _check("cudaDeviceSynchronize", lib.cudaDeviceSynchronize())
    time.sleep(hold_s)
    _check("cudaFree", lib.cudaFree(ptr))


def _driver(size: int, hold_s: float) -> None:
    lib = _load("libcuda.so.1", "libcuda.so")
    device, context, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    _check("cuInit", lib.cuInit(0))
    _check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(device), 0))
    _check("cuCtxCreate", lib.cuCtxCreate_v2(ctypes.byref(context), 0, device))
    _check("cuMemAlloc", lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)))
    _check("cuMemsetD8", lib.cuMemsetD8_v2(ptr, ctypes.c_ubyte(1), ctypes.c_size_t(size)))
    _check("cuCtxSynchronize", lib.cuCtxSynchronize())
    time.sleep(hold_s)
    _check("cuMemFree", lib.cuMemFree_v2(ptr))
    _check("cuCtxDestroy", lib.cuCtxDestroy_v2(context))


WAYS = (("torch", _torch), ("cupy", _cupy), ("cudart", _cudart), ("libcuda", _driver))


def alloc(request: dict[str, Any]) -> dict[str, Any]:
    """Allocate ``request["mib"]`` MiB, hold them ``request["hold_s"]`` seconds, free them."""
    size, hold_s = int(request["mib"]) * MiB, float(request["hold_s"])
    if size == 0:  # a dry run of the path: nothing allocated
        time.sleep(hold_s)
        return {"via": "none", "mib": 0, "pid": os.getpid(),
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}  # fmt: skip
    tried = []
    for via, way in WAYS:
        try:
            way(size, hold_s)
        except ImportError as exc:
            tried.append(f"{via}: {exc}")
            continue
        return {"via": via, "mib": size // MiB, "pid": os.getpid(),
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}  # fmt: skip
    raise RuntimeError("no way to allocate device memory here: " + "; ".join(tried))
