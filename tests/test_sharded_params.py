"""Sharded parameters: DeepSpeed ZeRO-3 and DTensor (FSDP2 / tensor parallel) weights reaching liger_core.

- ZeRO-3, real: 2 CPU processes (gloo, DeepSpeed's CPU accelerator) train a patched tiny Llama with every
  parameter partitioned and match one unpatched process (tests/dist_scripts/zero3_train.py). Needs
  `deepspeed` importable: tests/run_all.sh installs it in the core venvs with
  `DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed` (no C++ op is compiled).
- ZeRO-3, simulated (always runs): ``FakeZeRO3`` does to one module what ZeRO-3 does (empty local tensors,
  gathered only around the module's forward and again for its backward, ``ds_id``/``ds_status``), so the
  forward redirection of the fused loss, the patch-time check and ``gathered_weights`` are tested without
  DeepSpeed.
- DTensor ops: 2 CPU processes (tests/dist_scripts/dtensor_ops.py).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import liger_core
from liger_core.patching import distributed as ldist

SCRIPTS = Path(__file__).parent / "dist_scripts"
HAS_GLOO = dist.is_available() and dist.is_gloo_available()
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def _torchrun(script: Path, *flags: str, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(script), *flags]
    child_env = dict(os.environ, OMP_NUM_THREADS="1", **env)
    return subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=600)


# ----------------------------------------------------------------------------------------------------------
# multi-process runs
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_GLOO, reason="needs torch.distributed with the gloo backend")
def test_dtensor_ops_two_ranks():
    proc = _torchrun(SCRIPTS / "dtensor_ops.py")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "OK: DTensor ops" in proc.stdout, output[-6000:]


@pytest.mark.skipif(not HAS_GLOO, reason="needs torch.distributed with the gloo backend")
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (see the module doc)")
@pytest.mark.parametrize(
    "flags", [[], ["--tie"], ["--patch-after-init"]], ids=["untied", "tied", "patched_after_init"]
)
def test_zero3_two_ranks_match_single_process(flags):
    pytest.importorskip("transformers")
    proc = _torchrun(SCRIPTS / "zero3_train.py", *flags, DS_ACCELERATOR="cpu")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "OK: ZeRO-3 x2 patched == single-process unpatched" in proc.stdout, output[-6000:]


# ----------------------------------------------------------------------------------------------------------
# simulated ZeRO-3 (one process)
# ----------------------------------------------------------------------------------------------------------


class _RegatherForBackward(torch.autograd.Function):
    """Identity on a module output whose backward first gathers the module's parameters (ZeRO-3's
    pre-backward hook)."""

    @staticmethod
    def forward(ctx, zero3, x):
        ctx.zero3 = zero3
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.zero3.gather()
        return None, grad


class FakeZeRO3:
    """ZeRO-3's view of one module's own parameters, in one process.

    Outside the module's forward each parameter's data is an empty tensor (``ds_status`` "NOT_AVAILABLE");
    the forward pre-hook gathers (restores the full data), the forward hook frees it again and routes the
    outputs through ``_RegatherForBackward``, so the backward sees the full weight, as with DeepSpeed. A
    weight used outside the module's forward is empty: the op must refuse it (or the caller must redirect).
    """

    def __init__(self, module: nn.Module) -> None:
        self.params = list(module.parameters(recurse=False))
        self.full = {}
        for i, p in enumerate(self.params):
            p.ds_id = 1000 + i
            self.full[p] = p.data
        self.release()
        module.register_forward_pre_hook(lambda mod, args: self.gather())
        module.register_forward_hook(self._after_forward)

    def gather(self) -> None:
        for p in self.params:
            p.data = self.full[p]
            p.ds_status = "AVAILABLE"

    def release(self) -> None:
        for p in self.params:
            p.data = torch.empty(0, dtype=p.dtype)
            p.ds_status = "NOT_AVAILABLE"

    def _after_forward(self, module, args, output):
        self.release()
        return _RegatherForBackward.apply(self, output) if torch.is_tensor(output) else output


def _tiny_llama(tie: bool = False):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=32,
        tie_word_embeddings=tie,
    )
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("patch_after_sharding", [False, True], ids=["patched_first", "patched_after"])
def test_fake_zero3_lm_head_fused_loss_matches_unpatched(patch_after_sharding):
    reference = _tiny_llama()
    model = copy.deepcopy(reference)
    if not patch_after_sharding:
        liger_core.apply_liger_kernel(model)
    FakeZeRO3(model.lm_head)
    if patch_after_sharding:  # lm_head's weight is empty and hooked when the patch looks at it
        report = liger_core.apply_liger_kernel(model)
        assert report.swapped.get("fused_linear_cross_entropy") == 1, report
    assert model.lm_head.weight.numel() == 0
    ids = torch.randint(0, 96, (2, 9))
    labels = ids.clone()
    labels[0, :3] = -100
    reference.train()
    model.train()
    ref_loss = reference(input_ids=ids, labels=labels).loss
    ref_loss.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the materialised-logits fallback warns: it must not be taken
        out = model(input_ids=ids, labels=labels)
    assert out.logits is None
    assert model.lm_head.weight.numel() == 0  # freed again after lm_head's (redirected) forward
    torch.testing.assert_close(out.loss, ref_loss, rtol=1e-5, atol=1e-6)
    out.loss.backward()
    ref_params = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_params[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def test_fake_zero3_weight_outside_forward_is_refused_clearly():
    head = nn.Linear(8, 12, bias=False)
    FakeZeRO3(head)
    hidden, target = torch.randn(5, 8), torch.randint(0, 12, (5,))
    with pytest.raises(ValueError, match="ZeRO-3 partitioned parameter.*run_with_full_weight"):
        liger_core.ops.fused_linear_cross_entropy(hidden, head.weight, target)
    with pytest.raises(ValueError, match="ZeRO-3 partitioned parameter"):
        liger_core.ops.fused_linear_jsd(hidden, head.weight, hidden, torch.randn(12, 8))
    norm_weight = nn.Parameter(torch.empty(0))
    norm_weight.ds_id, norm_weight.ds_status = 7, "NOT_AVAILABLE"
    with pytest.raises(ValueError, match="w is a DeepSpeed ZeRO-3 partitioned parameter"):
        liger_core.ops.rms_norm(torch.randn(3, 4), norm_weight)


def test_run_with_full_weight_redirects_only_sharded_modules():
    head = nn.Linear(8, 12, bias=False)
    full = head.weight.detach().clone()
    hidden, target = torch.randn(5, 8, requires_grad=True), torch.randint(0, 12, (5,))
    ref_hidden = hidden.detach().clone().requires_grad_()
    ref = liger_core.ops.fused_linear_cross_entropy(ref_hidden, full.clone().requires_grad_(), target)
    ref.backward()

    def loss_fn(h):
        return liger_core.ops.fused_linear_cross_entropy(h, head.weight, target)

    calls = []
    head.register_forward_pre_hook(lambda mod, args: calls.append("pre"))
    plain = ldist.run_with_full_weight(head, loss_fn, hidden)  # no engine: called directly, hooks not run
    assert calls == []
    torch.testing.assert_close(plain, ref)

    FakeZeRO3(head)
    hidden.grad = None
    loss = ldist.run_with_full_weight(head, loss_fn, hidden)
    assert calls == ["pre"] and head.weight.numel() == 0
    torch.testing.assert_close(loss, ref)
    loss.backward()
    torch.testing.assert_close(hidden.grad, ref_hidden.grad)
    assert head.weight.grad is not None and head.weight.grad.shape == full.shape
    assert "forward" not in head.__dict__  # the module's own forward is back


def test_gathered_weights_uses_deepspeed_for_frozen_zero3_params(monkeypatch):
    gathered = []

    @contextlib.contextmanager
    def gathered_parameters(params, modifier_rank=None):
        gathered.append((list(params), modifier_rank))
        yield

    fake = types.ModuleType("deepspeed")
    fake.zero = types.SimpleNamespace(GatheredParameters=gathered_parameters)
    monkeypatch.setitem(sys.modules, "deepspeed", fake)

    plain = torch.randn(3, 4)
    frozen = nn.Parameter(torch.randn(5, 4), requires_grad=False)
    frozen.ds_id, frozen.ds_status = 3, "NOT_AVAILABLE"
    with ldist.gathered_weights(plain, frozen) as (a, b):
        assert a is plain and b is frozen
    assert gathered == [([frozen], None)]

    trainable = nn.Parameter(torch.randn(5, 4))
    trainable.ds_id, trainable.ds_status = 4, "NOT_AVAILABLE"
    with pytest.raises(ValueError, match="requires grad.*run_with_full_weight"):
        with ldist.gathered_weights(trainable):
            pass
    with torch.no_grad(), ldist.gathered_weights(trainable):  # no autograd: a read-only gather is fine
        pass
    assert len(gathered) == 2


def test_redirected_linear_recognises_only_plain_sharded_linears():
    head = nn.Linear(4, 6)
    assert ldist.redirected_linear(head) is None  # not sharded: the plain fused path takes it
    FakeZeRO3(head)
    assert ldist.redirected_linear(head) is head
    lora_like = nn.Sequential(nn.Linear(4, 6))
    FakeZeRO3(lora_like[0])
    assert ldist.redirected_linear(lora_like) is None
