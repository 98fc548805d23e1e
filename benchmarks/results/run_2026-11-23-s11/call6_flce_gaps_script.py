import sys, time, torch
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
from e2e_llama1b import _idle_gaps
from torch.profiler import profile, ProfilerActivity
from liger_core.ops import fused_linear_cross_entropy as flce
bt, hs, v = 8192, 4096, 128256
h = torch.randn(bt, hs, device="cuda").bfloat16().requires_grad_()
w = (torch.randn(v, hs, device="cuda") / hs**0.5).bfloat16().requires_grad_()
t = torch.randint(0, v, (bt,), device="cuda")
budget = 4 * (v + bt) * hs + 512 * 2**20
for name, kw in (("budget+512", dict(max_chunk_bytes=budget)), ("budget+512 nocheck", dict(max_chunk_bytes=budget, check_targets=False))):
    for _ in range(3):
        flce(h, w, t, **kw).backward(); h.grad = w.grad = None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter(); flce(h, w, t, **kw).backward(); torch.cuda.synchronize(); wall = (time.perf_counter() - t0) * 1e3
    h.grad = w.grad = None
    gaps = _idle_gaps(prof, min_us=50)
    kern = sum(e.device_time_total for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3
    print(f"{name}: wall {wall:.2f} ms, kernels {kern:.2f} ms, idle {gaps['total_ms']} ms in {gaps['n_gaps']} gaps")
    for g in gaps["largest"]: print("   ", g)
    cpu = sorted((e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU), key=lambda e: -e.self_cpu_time_total)[:12]
    for e in cpu: print(f"    cpu {e.self_cpu_time_total/1e3:8.2f} ms  x{e.count:4d} {e.key[:80]}")
