"""``liger_core.patching.peers``: liger-kernel's patches are found in a model (module classes, class and
instance forwards, functions of the modeling module) and a model carrying them is refused."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

import liger_core
from liger_core.patching import PatchReport, liger_kernel_parts, peers, refuse_liger_kernel, served_by

MODELING = "probe_modeling_peers"  # the "modeling module" the toy model's classes come from


def _from(module_name: str, obj):
    obj.__module__ = module_name
    return obj


@pytest.fixture
def modeling(monkeypatch):
    """A modeling module with a block and a model class; liger-kernel's look-alikes are made per test."""
    module = types.ModuleType(MODELING)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([Block(), Block()])

    for cls in (Block, Model):
        cls.__module__ = MODELING
        setattr(module, cls.__name__, cls)
    module.apply_rotary_pos_emb = _from(MODELING, lambda q, k: (q, k))
    monkeypatch.setitem(sys.modules, MODELING, module)
    return module


def test_a_plain_model_has_no_part_of_liger_kernel(modeling):
    model = modeling.Model()
    assert liger_kernel_parts(model) == []
    refuse_liger_kernel(model, flag="use_liger_kernel", applied_by="x")  # nothing raised


def test_each_kind_of_part_is_found(modeling):
    class LigerRMSNorm(nn.Module):
        def forward(self, x):
            return x

    LigerRMSNorm.__module__ = "liger_kernel.transformers.rms_norm"
    model = modeling.Model()
    model.layers[0].norm = LigerRMSNorm()
    model.layers[1].forward = _from("liger_kernel.transformers.model.llama", lambda x: x)
    modeling.apply_rotary_pos_emb = _from("liger_kernel.transformers.rope", lambda q, k: (q, k))
    assert liger_kernel_parts(model) == [
        "layers.0.norm: class liger_kernel.transformers.rms_norm.LigerRMSNorm",
        "layers.1: forward from liger_kernel.transformers.model.llama",
        f"{MODELING}.apply_rotary_pos_emb from liger_kernel.transformers.rope",
    ]
    # a class-level forward replaced on the model's own class
    modeling.Block.forward = _from("liger_kernel.transformers.model.llama", lambda self, x: x)
    assert "layers.0: Block.forward from liger_kernel.transformers.model.llama" in liger_kernel_parts(model)


def test_refusal_names_the_parts_the_flag_and_the_sources(modeling):
    class LigerSwiGLUMLP(nn.Module):
        pass

    LigerSwiGLUMLP.__module__ = "liger_kernel.transformers.swiglu"
    model = modeling.Model()
    for i in range(8):
        model.add_module(f"mlp{i}", LigerSwiGLUMLP())
    with pytest.raises(RuntimeError) as info:
        refuse_liger_kernel(model, flag="enable_liger_kernel", applied_by="a liger_kernel.transformers call")
    message = str(info.value)
    assert message.startswith("liger_core: Model already runs liger-kernel's patches (mlp0: class ")
    assert "mlp5" in message and "mlp6" not in message and "; ...)" in message  # six named, then "..."
    assert (
        "(a liger_kernel.transformers call). Remove it: enable_liger_kernel is served by liger_core"
        in message
    )


def test_served_by_names_the_versions_and_an_unused_liger_kernel(monkeypatch):
    versions = {"liger-core-x": "1.2.3"}
    monkeypatch.setattr(peers, "installed_version", versions.get)
    assert served_by("use_liger_kernel", "liger-core-x") == (
        f"use_liger_kernel is served by liger_core {liger_core.__version__} (liger-core-x 1.2.3), "
        "not by liger-kernel"
    )
    versions["liger-kernel"] = "0.8.1"
    assert served_by("enable_liger_kernel", "liger-core-y").endswith(
        "(liger-core-y ?), not by liger-kernel; liger-kernel 0.8.1 is installed and is not applied"
    )
    monkeypatch.undo()
    assert peers.installed_version("no-such-distribution-liger-core") is None


def test_report_active_kernels_counts_swapped_and_already_patched():
    report = PatchReport(model_type="llama")
    assert report.active_kernels() == "none"
    report.count("rope", 2)
    report.count_already("rms_norm", 5)
    report.count_already("rope", 1)
    report.count("swiglu", 0)
    assert report.active_kernels() == "rms_norm x5, rope x3"


def test_one_kernel_error_carries_the_report_and_the_plugins_message():
    from liger_core.patching import PatchIncompleteError

    error = PatchIncompleteError.one_kernel("Owner", "fused_linear_cross_entropy", "an adapter", "the text")
    assert isinstance(error, RuntimeError) and str(error) == "the text" and error.undone
    assert error.report.model_type == "Owner"
    assert error.report.missing == {"fused_linear_cross_entropy": ["an adapter"]}
    assert not PatchIncompleteError.one_kernel("O", "rope", "r", "m", undone=False).undone
