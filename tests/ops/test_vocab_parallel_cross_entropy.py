"""vocab_parallel_cross_entropy: one process (the whole vocabulary, or a shard with a given vocab_start) vs
the float64 cross-entropy and no worse than eager; two gloo processes with the vocabulary split unevenly
(tests/dist_scripts/vocab_parallel_ce.py) against the unsharded loss and gradients."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_no_worse_than_eager, leaf, noncontiguous, use_reference_path

from liger_core import reference
from liger_core.modules import LigerVocabParallelCrossEntropy
from liger_core.ops import vocab_parallel_cross_entropy

SCRIPT = Path(__file__).parents[1] / "dist_scripts" / "vocab_parallel_ce.py"


def _eager(logits, target):
    upcast = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.nn.functional.cross_entropy(upcast.transpose(1, -1), target, reduction="none")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_single_process_matches_float64(dtype):
    """(3, 13, 1031) strided logits with +-1e4 entries, some targets ignored, grad_output per token."""
    logits = noncontiguous((torch.randn(3, 13, 1031, dtype=torch.float64) * 3).to(dtype))
    logits[0, 0, 5], logits[1, 2, 7] = 1e4, -1e4
    target = torch.randint(0, 1031, (3, 13))
    target[2, :4] = -100
    go = torch.rand(3, 13, dtype=torch.float64)
    out = {}
    for name, fn, cast in (
        ("ours", lambda x: vocab_parallel_cross_entropy(x, target), None),
        ("eager", lambda x: _eager(x, target), None),
        ("ref", lambda x: _eager(x, target), torch.float64),
    ):
        x = leaf(logits, cast)
        loss = fn(x)
        (grad,) = torch.autograd.grad(loss, x, go.to(loss.dtype))
        out[name] = (loss, grad)
    assert out["ours"][0].dtype == torch.float32 and out["ours"][1].dtype == dtype
    for i, name in enumerate(("loss", "grad")):
        assert_no_worse_than_eager(name, out["ours"][i], out["eager"][i], out["ref"][i])
    assert (out["ours"][1][2, :4] == 0).all() and (out["ours"][0][2, :4] == 0).all()


def test_shard_of_one_rank_and_module(monkeypatch):
    """Without a group, a shard with vocab_start is the cross-entropy over its columns (global targets)."""
    logits = torch.randn(6, 20)
    target = torch.tensor([10, 15, 11, 19, -100, 12])
    shard = logits[:, 10:]
    got = vocab_parallel_cross_entropy(shard, target, vocab_start=10)
    want = torch.nn.functional.cross_entropy(shard.double(), target - 10, ignore_index=-110, reduction="none")
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    module = LigerVocabParallelCrossEntropy()
    torch.testing.assert_close(module(logits, target), vocab_parallel_cross_entropy(logits, target))
    use_reference_path(monkeypatch)
    torch.testing.assert_close(
        vocab_parallel_cross_entropy(shard, target, vocab_start=10),
        reference.vocab_parallel_cross_entropy(shard, target, 10),
    )
    with pytest.raises(ValueError, match="reduction"):
        LigerVocabParallelCrossEntropy(reduction="mean")
    with pytest.raises(ValueError, match="target"):
        vocab_parallel_cross_entropy(logits, torch.full((6,), 20))
    with pytest.raises(ValueError, match="target"):
        vocab_parallel_cross_entropy(shard, target, vocab_start=9)  # target 19 lies past this shard
    with pytest.raises(ValueError, match="target"):
        reference.vocab_parallel_cross_entropy(shard, target, 9)
    with pytest.raises(ValueError, match="target"):
        vocab_parallel_cross_entropy(logits, target[:3])
    with pytest.raises(ValueError, match="vocab_start"):
        vocab_parallel_cross_entropy(logits, target, vocab_start=-1)
    with pytest.raises(TypeError, match="process_group"):
        vocab_parallel_cross_entropy(logits, target, process_group="tp")


def test_two_ranks_match_unsharded():
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(SCRIPT),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "OK: vocab parallel CE" in proc.stdout, output[-6000:]


def test_empty_rows():
    x = leaf(torch.randn(2, 0, 5))
    loss = vocab_parallel_cross_entropy(x, torch.zeros(2, 0, dtype=torch.long))
    loss.sum().backward()
    assert loss.shape == (2, 0) and x.grad.shape == (2, 0, 5)
