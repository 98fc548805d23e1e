"""Patching a causal-LM head's loss on one built model (recipe and structural patching share it).

- ``fused_linear_cross_entropy``: the causal-LM gets ``causal_lm.causal_lm_forward`` inside its class
  forward's decorators (``causal_lm.causal_lm_forward_for``): the loss comes from the hidden states, and the
  (tokens x vocab) logits are never materialised in training.
- ``cross_entropy``: the model's ``loss_function`` (an instance attribute HF provides for this) is set to
  liger's cross-entropy. The process-global ``torch.nn.functional.cross_entropy`` is never replaced.
"""

from __future__ import annotations

from torch import nn

from liger_core.patching import causal_lm as cl
from liger_core.patching.report import PatchReport
from liger_core.patching.swaps import bind, class_forward_is, foreign_forward, own_kind, set_entry

FLCE = "fused_linear_cross_entropy"
CE = "cross_entropy"


def _unfusable_reason(root: nn.Module, spec: cl.LMSpec) -> str:
    try:
        name = type(cl.head_linear(root, spec)).__name__
    except AttributeError:
        name = "missing"
    return (
        f"{spec.linear} ({name}) is not a plain nn.Linear (LoRA, quantised or offloaded); "
        "the loss is computed by the model from its logits"
    )


def patch_loss(root: nn.Module, spec: cl.LMSpec, flags: dict[str, bool], report: PatchReport) -> None:
    """Swap in the loss ``flags`` ask for; a loss asked for and not applied is a miss with its reason."""
    kind = own_kind(root)
    class_flce = class_forward_is(root, cl.causal_lm_forward)
    class_ce = getattr(type(root), "_loss_function", None) is cl.liger_causal_lm_loss
    if flags[FLCE]:
        if kind == FLCE or class_flce:
            report.count_already(FLCE)
            if not cl.has_fusable_head(
                root, spec
            ):  # e.g. a LoRA adapter put on lm_head after the model was patched
                report.miss(FLCE, _unfusable_reason(root, spec))
        elif kind == CE or class_ce:
            report.miss(FLCE, "the loss already uses liger cross_entropy; revert() first to switch")
        elif foreign_forward(root):
            report.miss(
                FLCE, f"{type(root).__name__} already has an instance-level forward from another library"
            )
        elif not cl.has_fusable_head(root, spec):
            report.miss(FLCE, _unfusable_reason(root, spec))
        else:
            forward = cl.causal_lm_forward_for(type(root).forward)
            markers = {"_liger_core_lm_spec": spec, cl.ORIGINAL_FORWARD: type(root).forward}
            bind(root, root, forward, FLCE, **markers)
            report.count(FLCE)
            report.modules[""] = FLCE
    elif flags[CE]:
        if kind == CE or class_ce:
            report.count_already(CE)
        elif kind == FLCE or class_flce:
            report.miss(CE, "the loss already uses fused_linear_cross_entropy; revert() first to switch")
        else:
            # PreTrainedModel.loss_function is a property whose setter stores `_loss_function` on the instance
            set_entry(root, root, "_loss_function", cl.liger_causal_lm_loss, CE)
            report.count(CE)
            report.modules[""] = CE
