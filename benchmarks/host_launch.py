"""Host time of launching Triton kernels (issue 2 / 7: the norms and RoPE are host-bound at real shapes).

    PYTHONPATH=.:/tmp/liger_peer_site python benchmarks/host_launch.py

Sections: (1) one bare launch of a trivial kernel through ``kernel[grid](...)`` vs the cached compiled
kernel's launcher (``liger_core.ops._fastlaunch``), (2) host µs per fwd / fwd+bwd call at tiny shapes for
RMSNorm and LayerNorm, ours (fast launch on and off) beside liger-kernel, (3) cProfile of one LayerNorm
fwd+bwd at 16384x4096 (top functions by own time). GPU only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import variants_glu_rope as vr  # noqa: E402

from liger_core.harness import interpreter as harness_interpreter  # noqa: E402
from liger_core.harness import providers as harness_providers  # noqa: E402
from liger_core.harness import registry as harness_registry  # noqa: E402
from liger_core.ops import _fastlaunch  # noqa: E402


@triton.jit
def _touch_kernel(x_ptr, n, stride, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x + eps * stride, mask=offs < n)


def bare_launch() -> None:
    x = torch.zeros(64, device="cuda")
    fast = _fastlaunch.FastKernel(_touch_kernel)
    calls = {
        "kernel[grid](...)": lambda: _touch_kernel[(1,)](x, 64, 1, 0.0, BLOCK=64),
        "FastKernel": lambda: fast[(1,)](x, 64, 1, 0.0, BLOCK=64),
    }
    vr.log("-- host µs of one bare launch (trivial kernel, 4 runtime args)")
    for name, call in calls.items():
        vr.log(f"   {name:34s} {vr.per_call_us(call, 2000):6.1f}")
    torch.cuda.synchronize()
    assert torch.allclose(x, torch.zeros_like(x)), "trivial kernel changed x"


def norm_variants(op: str) -> dict:
    fn = harness_providers.provider_fn(harness_registry.OPS[op], "liger_core")[0]
    return {
        "liger_core (fast launch)": (fn, {_fastlaunch: {"ENABLED": True}}),
        "liger_core (kernel[grid])": (fn, {_fastlaunch: {"ENABLED": False}}),
        "liger_kernel": (vr.liger_kernel_fn(op), {}),
    }


def main() -> int:
    if not torch.cuda.is_available():
        print("host_launch: needs a CUDA GPU")
        return 0
    harness_interpreter.prepare_triton()
    for section in (
        bare_launch,
        lambda: vr.host_time("rms_norm", {"M": 16, "N": 4096}, norm_variants("rms_norm"), n=1000),
        lambda: vr.host_time("layer_norm", {"M": 16, "N": 4096}, norm_variants("layer_norm"), n=1000),
        lambda: vr.host_time(
            "rope", {"B": 1, "T": 16, "Hq": 8, "Hk": 2, "D": 128}, norm_variants("rope"), n=1000
        ),
        lambda: vr.host_profile("layer_norm", {"M": 16384, "N": 4096}),
    ):
        try:
            section()
        except Exception as e:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            vr.log(f"   ERROR {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
