"""Structural patching of RMSNorms without a weight (Gemma4's and Gemma3n's ``with_scale=False``): swapped for
``rms_norm_no_weight`` when the probe reproduces them, a parameterless look-alike left alone and reported as
skipped (not missed)."""

from __future__ import annotations

import torch
from torch import nn

import liger_core
from liger_core.patching import is_patched


class ToyNoScaleRMSNorm(nn.Module):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, hidden_states):
        x = hidden_states.float()
        return (x * torch.pow(x.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)).type_as(hidden_states)


class ToyHalvingRMSNorm(ToyNoScaleRMSNorm):
    """Not an RMSNorm without weight: a fixed scale of 1/2 after it."""

    def forward(self, hidden_states):
        return 0.5 * super().forward(hidden_states)


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj_in = nn.Linear(24, 48)
        self.v_norm = ToyNoScaleRMSNorm()
        self.odd_norm = ToyHalvingRMSNorm()
        self.proj_out = nn.Linear(48, 5)

    def forward(self, x):
        return self.proj_out(self.odd_norm(self.v_norm(self.proj_in(x))))


def test_weightless_rms_norm_is_patched_and_look_alike_skipped():
    torch.manual_seed(0)
    model = ToyModel()
    x = torch.randn(3, 7, 24)
    ref = model(x)
    ref.square().sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    report = liger_core.apply_liger_kernel(model)
    assert report.method == "structural"
    assert report.swapped == {"rms_norm": 1}, str(report)
    assert report.modules == {"v_norm": "rms_norm"}
    assert "rms_norm" not in report.missing
    assert any("ToyHalvingRMSNorm" in s for s in report.skipped), report.skipped

    y = model(x)
    y.square().sum().backward()
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], rtol=1e-4, atol=1e-6)
    liger_core.revert(model)
    assert not is_patched(model)
