"""30 AdamW steps on the corpus shipped with liger_core: the patched model's loss curve is the unpatched one's
(fp32), and the model learns (the loss falls), so the comparison is not between two flat lines.

Kept cheap for the Triton interpreter: one decoder layer, 2 x 8 tokens per step, and RoPE left unpatched here
(the interpreter spends ~0.1 s per token in the rope kernel; rope is checked step by step, forward and
backward, for every model type in test_model_parity.py). RMSNorm, SwiGLU and the fused linear cross-entropy
run their Triton kernels for all 30 steps.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_models import tiny_model

import liger_core

STEPS = 30


def _batches(n_steps: int, batch_size: int = 2, seq_len: int = 8):
    text = (Path(liger_core.__file__).parent / "data" / "tiny_stories.txt").read_bytes()
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(0)
    for _ in range(n_steps):
        starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=g)
        ids = torch.stack([data[s : s + seq_len] for s in starts.tolist()])
        yield ids, ids


def _curve(model):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    model.train()
    losses = []
    for ids, labels in _batches(STEPS):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return torch.tensor(losses)


def test_adamw_loss_curve_matches_unpatched():
    ref = _curve(tiny_model("llama", seed=5, vocab_size=256, num_hidden_layers=1))
    model = tiny_model("llama", seed=5, vocab_size=256, num_hidden_layers=1)
    report = liger_core.apply_liger_kernel(model, rope=False)
    assert report.swapped == {"rms_norm": 3, "swiglu": 1, "fused_linear_cross_entropy": 1}
    curve = _curve(model)
    assert ref[-5:].mean() < ref[:5].mean() - 1.0  # it learns
    torch.testing.assert_close(curve, ref, rtol=1e-4, atol=1e-5)
