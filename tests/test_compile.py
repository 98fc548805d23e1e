"""torch.compile(fullgraph=True) of a patched causal LM: no graph break, loss, logits and gradients as eager.

Two paths: the pure-PyTorch reference path (what CPU CI runs without Triton; `liger_core.dispatch` told Triton
is missing) and the Triton interpreter, where the autograd Functions call their `torch.library` custom ops
while dynamo traces (`dispatch.launcher`) and the compiled graph must contain them as opaque ops.
"""

from __future__ import annotations

import copy

import pytest
import torch

import liger_core
from liger_core import dispatch

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, BATCH = 128, 11, 2


def _tiny_llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # HF initialises norm weights to exactly 1: make their gradients path-dependent
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _recording_aot_eager(graph_codes: list[str]):
    """aot_eager, recording the code of every dynamo graph (and its subgraphs: autograd.Function bodies)."""
    aot_eager = torch._dynamo.backends.registry.lookup_backend("aot_eager")

    def backend(gm: torch.fx.GraphModule, example_inputs):
        graph_codes.append("\n".join(m.code for m in gm.modules() if isinstance(m, torch.fx.GraphModule)))
        return aot_eager(gm, example_inputs)

    return backend


def _loss_and_grads(run, model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor):
    """Loss and parameter gradients of ``run`` (``model`` or its compiled wrapper) on one batch."""
    model.zero_grad(set_to_none=True)
    out = run(input_ids=ids, labels=labels)
    assert out.logits is None  # the fused linear cross-entropy path: logits never materialised
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("path", ["reference", "interpreter"])
def test_compiled_patched_llama_matches_eager(path, monkeypatch):
    if path == "reference":
        monkeypatch.setattr(dispatch, "_STATUS", "missing")
    elif dispatch.triton_status() != "interpreted":
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1 on a machine without a GPU)")
    torch._dynamo.reset()

    model = _tiny_llama()
    report = liger_core.apply_liger_kernel(model)
    assert report.swapped.get("fused_linear_cross_entropy") == 1 and report.swapped.get("rope") == 2
    model.train()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels = ids.clone()
    labels[0, :3] = -100

    eager_loss, eager_grads = _loss_and_grads(model, model, ids, labels)

    graph_codes: list[str] = []
    compiled = torch.compile(model, fullgraph=True, backend=_recording_aot_eager(graph_codes))
    loss, grads = _loss_and_grads(compiled, model, ids, labels)

    assert len(graph_codes) == 1  # one graph, fullgraph=True: a break would have raised
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == eager_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)

    code = graph_codes[0]
    if path == "interpreter":  # the kernels are in the graph as custom ops, not traced through
        for op in ("rms_norm_fwd", "rope_fwd", "swiglu_fwd", "fused_linear_cross_entropy_fwd"):
            assert f"torch.ops.liger_core.{op}" in code, op
    else:
        assert "torch.ops.liger_core" not in code

    # eval (generation-style) path: logits through lm_head, compiled, equal to eager
    model.eval()
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        eager_logits = ref_model(input_ids=ids).logits
        logits = torch.compile(model, fullgraph=True, backend="aot_eager")(input_ids=ids).logits
    torch.testing.assert_close(logits, eager_logits, rtol=1e-5, atol=1e-5)
