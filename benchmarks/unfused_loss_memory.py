"""Peak memory of the patched *unfused* causal-LM loss (``fused_linear_cross_entropy=False``: HF's logits,
then ``liger_core.ops.cross_entropy``) beside HF eager, with the gradient in a new buffer (the session-5
path) and written over the loss's own fp32 upcast (now). bf16 tiny llama, vocabulary 32000, 4 x 512 tokens.

    PYTHONPATH=.:tests/patching python benchmarks/unfused_loss_memory.py
"""

from __future__ import annotations

import torch
from tiny_models import tiny_model

import liger_core

VOCAB, BATCH, SEQ = 32000, 4, 512


def main() -> None:
    ids = torch.randint(3, VOCAB, (BATCH, SEQ)).cuda()
    op = liger_core.ops.cross_entropy
    print(
        f"patched unfused CE (bf16 llama, vocab {VOCAB}, {BATCH * SEQ} tokens): "
        "fwd+bwd peak above the model, MiB"
    )
    for name in (
        "HF eager",
        "liger_core, gradient in a new buffer (before)",
        "liger_core, over its upcast (now)",
    ):
        model = tiny_model("llama", vocab_size=VOCAB, max_position_embeddings=SEQ)
        model = model.to(device="cuda", dtype=torch.bfloat16)
        if name != "HF eager":
            flags = dict(rms_norm=False, rope=False, swiglu=False, fused_linear_cross_entropy=False)
            liger_core.apply_liger_kernel(model, cross_entropy=True, **flags)
        if "before" in name:
            liger_core.ops.cross_entropy = lambda *a, **k: op(*a, **{**k, "inplace_backward": False})
        else:
            liger_core.ops.cross_entropy = op
        for _ in range(2):  # the second step is measured (warm caches)
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        print(f"  {name:48s} {peak:8.1f}  loss {loss.item():.6f}")
        del model
    liger_core.ops.cross_entropy = op
    print(f"  one fp32 logits buffer {ids.numel() * VOCAB * 4 / 2**20:.1f}")


if __name__ == "__main__":
    main()
