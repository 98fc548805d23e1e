"""``liger_core.compat.liger_kernel`` against an installed Liger-Kernel (run_all.sh's hf_trainer-liger-kernel
suite installs 0.8.5): every public name of ``liger_kernel.transformers``, its ``functional`` and
``liger_kernel.chunked_loss`` exists in the compat layer with the same parameters (names, kinds, defaults),
so moving code over is one changed import. Without Liger-Kernel, the compat layer imports and patches without
it (it never imports ``liger_kernel``)."""

from __future__ import annotations

import importlib.util
import inspect
import sys

HAS_LIGER_KERNEL = importlib.util.find_spec("liger_kernel") is not None


def _params(obj) -> list[tuple[str, object, object]]:
    """(name, kind, default) of a function's parameters, or of a class's ``__init__`` less ``self``."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = list(inspect.signature(target).parameters.values())
    if inspect.isclass(obj):
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


def _compare(theirs_module, ours_module, names, skip=()):
    mismatched = {}
    for name in names:
        assert hasattr(ours_module, name), f"{ours_module.__name__} has no {name}"
        theirs, ours = getattr(theirs_module, name), getattr(ours_module, name)
        if name in skip or not callable(theirs):
            continue
        if _params(theirs) != _params(ours):
            mismatched[name] = f"{_params(theirs)} != {_params(ours)}"
    assert not mismatched, "\n".join(f"{k}: {v}" for k, v in mismatched.items())


def test_compat_layer_matches_the_installed_liger_kernel():
    if not HAS_LIGER_KERNEL:  # this suite's venv without Liger-Kernel: the compat layer needs none
        from transformers import LlamaConfig, LlamaForCausalLM

        from liger_core.compat.liger_kernel import transformers as compat

        config = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, num_key_value_heads=2, **config))
        report = compat.apply_liger_kernel_to_llama(model=model)
        assert report and "liger_kernel" not in sys.modules
        return

    import liger_kernel.chunked_loss as lk_chunked
    import liger_kernel.transformers as lk
    import liger_kernel.transformers.functional as lk_functional

    from liger_core.compat.liger_kernel import chunked_loss as ours_chunked
    from liger_core.compat.liger_kernel import transformers as ours
    from liger_core.compat.liger_kernel.transformers import functional as ours_functional
    from liger_core.compat.liger_kernel.transformers.modules import DEFERRED

    # Classes built lazily from liger_core.modules take whatever liger_core's class takes; AutoLiger... has
    # classmethods only.
    _compare(lk, ours, lk.__all__, skip={*DEFERRED, "AutoLigerKernelForCausalLM"})
    assert callable(ours.AutoLigerKernelForCausalLM.from_pretrained)
    functional = [n for n in dir(lk_functional) if n.startswith("liger_")]
    # Functions liger_core has no op for take anything and raise NotImplementedError naming themselves.
    _compare(lk_functional, ours_functional, functional, skip=set(ours_functional.NOT_IN_LIGER_CORE))
    chunked = [n for n in dir(lk_chunked) if n.startswith("LigerFusedLinear")]
    _compare(lk_chunked, ours_chunked, chunked, skip={"LigerFusedLinearCosineSimilarityLoss"})
    for name in chunked:
        theirs, mine = getattr(lk_chunked, name), getattr(ours_chunked, name)
        if name != "LigerFusedLinearCosineSimilarityLoss":
            assert _params(theirs.forward)[1:] == _params(mine.forward)[1:], name
