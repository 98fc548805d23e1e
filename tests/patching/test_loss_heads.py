"""Structural patching of causal-LM heads that are not ``lm_head(h)`` + shifted cross-entropy: the probe finds
each head's layout and quirks as ``LMSpec`` data (label shift, config logits transforms, an output Linear with
a bias behind a transform, an encoder-decoder's decoder inputs), and the fused loss equals the model's own."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from toy_model import ToyConfig, ToyForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

import liger_core


class UnshiftedLM(ToyForCausalLM):
    """labels[..., i] is the target of logits[..., i] (BART's and CPM-Ant's *ForCausalLM)."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        logits = self.lm_head(self.model(input_ids=input_ids)[0])
        loss = None if labels is None else F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return CausalLMOutputWithPast(loss=loss, logits=logits)


class SoftcappedLM(ToyForCausalLM):
    """Soft-capped logits under a config name of its own (RecurrentGemma's ``logits_soft_cap``)."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        logits = self.lm_head(self.model(input_ids=input_ids)[0])
        cap = self.config.logits_soft_cap
        logits = torch.tanh(logits / cap) * cap
        loss = None if labels is None else self.loss_function(logits, labels, self.config.vocab_size)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


class TransformHead(nn.Module):
    """RoBERTa's head: dense -> gelu -> LayerNorm -> decoder (with a bias), the last step in a helper."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def project(self, x):
        return self.decoder(x)

    def forward(self, x):
        return self.project(self.norm(F.gelu(self.dense(x))))


class TransformHeadLM(ToyForCausalLM):
    """Logits from ``lm_head.decoder`` after a transform, divided by ``config.logits_scaling`` (Granite)."""

    def __init__(self, config):
        super().__init__(config)
        self.lm_head = TransformHead(config)
        with torch.no_grad():
            self.lm_head.decoder.bias.normal_()  # a bias that matters (its init is random but small)

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def forward(self, input_ids=None, labels=None, **kwargs):
        logits = self.lm_head(self.model(input_ids=input_ids)[0]) / self.config.logits_scaling
        loss = None if labels is None else self.loss_function(logits, labels, self.config.vocab_size)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


class SmoothedLM(ToyForCausalLM):
    """A loss the fused cross-entropy does not compute (label smoothing): a miss, never a wrong swap."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        logits = self.lm_head(self.model(input_ids=input_ids)[0])
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), label_smoothing=0.1)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


def _step(model, ids):
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


CASES = [
    (UnshiftedLM, {}, dict(shift_labels=False, linear="lm_head")),
    (SoftcappedLM, dict(logits_soft_cap=0.5), dict(softcap_attr="logits_soft_cap", shift_labels=True)),
    (
        TransformHeadLM,
        dict(logits_scaling=3.0),
        dict(head=("lm_head",), linear="lm_head.decoder", logits_scaling_attr="logits_scaling"),
    ),
]


@pytest.mark.parametrize("cls,config,expected", CASES, ids=[c[0].__name__ for c in CASES])
def test_head_quirks_are_found_and_the_fused_loss_is_exact(cls, config, expected):
    torch.manual_seed(0)
    model = cls(ToyConfig(**config))
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    ref = copy.deepcopy(model)
    ref_out, ref_grads = _step(ref, ids)

    report = liger_core.apply_liger_kernel(model)
    assert report.swapped.get("fused_linear_cross_entropy") == 1, str(report)
    assert "fused_linear_cross_entropy" not in report.missing, str(report)
    spec = model._liger_core_lm_spec
    for field, value in expected.items():
        assert getattr(spec, field) == value, (field, spec)

    out, grads = _step(model, ids)
    assert out.logits is None  # training with labels: the logits are never materialised
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(
            g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )

    model.eval()  # logits asked for: the model's own
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ref.eval()(input_ids=ids).logits)


def test_a_loss_the_fused_loss_cannot_compute_is_a_miss_with_its_error():
    torch.manual_seed(0)
    model = SmoothedLM(ToyConfig())
    report = liger_core.apply_liger_kernel(model)
    assert "fused_linear_cross_entropy" not in report.swapped
    (reason,) = report.missing["fused_linear_cross_entropy"]
    assert "differs from the model's own" in reason
    assert "_liger_core_lm_spec" not in model.__dict__
