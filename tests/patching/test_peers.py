"""``liger_core.patching.peers``: liger-kernel's patches are found in a model (module classes, class and
instance forwards, functions of the modeling module) and a model carrying them is refused."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from liger_core.patching import liger_kernel_parts, refuse_liger_kernel

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
