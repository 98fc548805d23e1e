"""Cross-entropy over a vocabulary, with the gradient computed in the forward pass.

For one row ``x`` (V logits), target ``y`` (not ``ignore_index``), class weights ``w`` (all 1 without
``weight``, ``W = sum_c w_c``), label smoothing ``eps``, z-loss scale ``zs``; optional softcap first,
``x <- softcap * tanh(x_raw / softcap)``::

    lse    = m + log(d),  m = max_c x_c,  d = sum_c exp(x_c - m)  (online: running max + rescaled sum)
    loss   = (1 - eps) * w_y * (lse - x_y)  +  eps / V * sum_c w_c * (lse - x_c)  +  zs * lse^2
    dx_c   = [(1 - eps) * w_y + eps / V * W] * p_c  -  (1 - eps) * w_y * [c == y]  -  eps / V * w_c
             + 2 * zs * lse * p_c,                p_c = exp(x_c - m) / d
    dx_raw = dx * (1 - tanh^2(x_raw / softcap))                    (softcap only)

Reductions (torch's): ``sum``; ``mean`` divides the cross-entropy terms by ``sum_i w_{y_i}`` over the
non-ignored rows (the row count without weights) and the z-loss terms by the non-ignored row count, as IEEE
division does (nothing to average over: NaN, as torch's 0 / 0); ``none`` keeps one loss per row. Ignored rows
are never read: loss 0 and gradient 0. The loss is fp32 whatever the logits' dtype.

Non-finite logits give torch's results (non-ignored rows): a row with a NaN or +inf logit, or only -inf ones,
has a NaN loss and gradient; a -inf logit has probability 0, and one at the target makes the loss +inf (with
label smoothing, any -inf logit does) while the gradient stays finite.

Kernels, in launch order (no host sync between them):

1. ``_target_stats_kernel`` (one program): non-ignored rows, their class-weight sum, the smallest and largest
   non-ignored target, the sum of all class weights, into a small fp64 buffer on the device. The reduction's
   denominators are read from it by the next kernels, so nothing waits for the host.
2. ``_cross_entropy_kernel`` (one program per row): pass 1 streams the row in column blocks once for the
   running max, the rescaled sum of exponentials, the smoothing sum and the loss; pass 2 reads it again and
   writes the gradient, optionally into the logits buffer itself. Pass-1 loads are marked evict-last and
   pass-2 loads and the stores evict-first, so that pass 2 finds the row in L2 (the rows in flight, one per
   SM, 33 MB at V = 128k bf16, fit in it): HBM sees about one read and one write of the logits. Per-element
   math in fp32 for 16-bit logits and in fp64 for fp32 logits (never less exact than eager fp32 that way),
   per-row scalars in fp64, one rounding to the gradient's dtype (the logits').
3. ``_reduce_losses_kernel``: the per-row fp64 terms summed (and divided) in fp64, one rounding to the fp32
   loss.

The target range is copied to pinned host memory right after kernel 1 (an event marks it), and the host
waits for that event only once kernels 2 and 3 are queued, then raises a ValueError for a target outside
[0, V) (the kernels clamp such an index, so they never read out of bounds): the GPU never idles for the
check, and the host's next work (the backward) overlaps the loss kernel. ``check_targets=False`` skips it, and
so does a CUDA-graph capture (no host read-back is possible there).
Backward only multiplies the stored gradient by ``grad_output`` (a kernel that returns at once where
``grad_output`` is exactly 1, so a plain ``loss.backward()`` costs no pass over memory). fp16 logits are the
exception: their gradient entries are mostly subnormal, which that second rounding would lose (a loss scaler's
2^16 then multiplies the loss), so for fp16 the forward pass computes only the losses and backward runs kernel
2 with ``grad_output`` inside the one rounding (one more read of the logits).

On Hopper GPUs, kernel 2 for 16-bit logits of up to 131072 classes (no class weights, no softcap) is the Gluon
kernel of ``_cross_entropy_resident``, which keeps the row in shared memory and registers between the passes.
"""

from __future__ import annotations

import torch

from liger_core import reference
from liger_core.dispatch import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_same_device,
    check_shape,
    check_tensor,
    launcher,
    use_triton,
)
from liger_core.loss_options import CrossEntropyOptions, CrossEntropyOutput, finish_outputs
from liger_core.loss_options import resolve as resolve_options
from liger_core.ops._ce_kernel import launch_cross_entropy
from liger_core.ops._ce_math import (
    _scale_rows,
    _scale_rows_impl,
    check_targets_host,
    denominator_tensor,
    finish_target_check,
    reduce_losses,
    start_target_check,
    target_stats,
    with_denominator,
)

# ----------------------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile; the host sync of the target check stays inside them). The autograd
# Functions call them through ``dispatch.launcher``: the custom op while torch.compile traces, the plain
# ``*_impl`` in eager mode (the dispatcher's host time per call is tens of microseconds).
# ----------------------------------------------------------------------------------------------------------


def _forward_impl(
    logits,
    target,
    weight,
    grad,
    ignore_index,
    reduction,
    label_smoothing,
    lse_square_scale,
    softcap,
    check_targets,
    denominator=None,
    grad_scale=None,
    token_scaling=False,
):
    n_cols = logits.shape[1]
    if denominator is not None:  # reduction "sum" divided by it: a "mean" over the given count
        reduction = "mean"
    stats = target_stats(target, weight if label_smoothing != 0.0 or reduction == "mean" else None,
                         ignore_index, n_cols)  # fmt: skip
    pending = start_target_check(stats) if check_targets else None
    if denominator is not None:
        stats = with_denominator(stats, denominator)
    loss_rows = torch.empty(logits.shape[0], dtype=torch.float64, device=logits.device)
    z_rows = torch.empty_like(loss_rows)
    launch_cross_entropy(
        logits,
        target,
        weight,
        grad,
        loss_rows,
        z_rows,
        stats,
        ignore_index=ignore_index,
        mean=reduction == "mean",
        label_smoothing=label_smoothing,
        lse_square_scale=lse_square_scale,
        softcap=softcap,
        grad_scale=grad_scale,
        token_scaling=token_scaling,
    )
    loss, z = reduce_losses(loss_rows, z_rows, stats, reduction)
    if pending is not None:  # after the launches: the GPU works while the host waits for the stats
        finish_target_check(pending, ignore_index, n_cols)
    return loss, z


def _fake_losses(logits, reduction):
    shape = (logits.shape[0],) if reduction == "none" else ()
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.float32)


def _cross_entropy_fwd_impl(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    compute_grad: bool,
    check_targets: bool = True,
    denominator: torch.Tensor | None = None,
    token_scaling: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, z_loss, grad) with the gradient in a new buffer (empty when ``compute_grad`` is False);
    ``token_scaling``: Liger-Kernel's per-token scaling (``CrossEntropyOptions.use_token_scaling``)."""
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format) if compute_grad else None
    loss, z = _forward_impl(
        logits,
        target,
        weight,
        grad,
        ignore_index,
        reduction,
        label_smoothing,
        lse_square_scale,
        softcap,
        check_targets,
        denominator,
        token_scaling=token_scaling,
    )
    return loss, z, grad if grad is not None else logits.new_empty(0)


_cross_entropy_fwd = torch.library.custom_op(
    "liger_core::cross_entropy_fwd", _cross_entropy_fwd_impl, mutates_args=()
)


# The fakes name the leading parameters they read; the rest (the impl's list, trailing defaults included,
# which the dispatcher may leave out) they take as ``*_`` and ``**__``.
@_cross_entropy_fwd.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
      compute_grad, *_, **__):  # fmt: skip
    grad = (
        torch.empty_like(logits, memory_format=torch.contiguous_format)
        if compute_grad
        else logits.new_empty(0)
    )
    return (*_fake_losses(logits, reduction), grad)


def _cross_entropy_fwd_inplace_impl(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    check_targets: bool = True,
    denominator: torch.Tensor | None = None,
    token_scaling: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, z_loss); overwrites ``logits`` with the gradient (declared as a mutation, so autograd's version
    counter flags any other use of the old values in backward)."""
    return _forward_impl(
        logits,
        target,
        weight,
        logits,
        ignore_index,
        reduction,
        label_smoothing,
        lse_square_scale,
        softcap,
        check_targets,
        denominator,
        token_scaling=token_scaling,
    )


_cross_entropy_fwd_inplace = torch.library.custom_op(
    "liger_core::cross_entropy_fwd_inplace", _cross_entropy_fwd_inplace_impl, mutates_args=("logits",)
)


@_cross_entropy_fwd_inplace.register_fake
def _(logits, target, weight, ignore_index, reduction, *_, **__):
    return _fake_losses(logits, reduction)


def _grad_in_backward_impl(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    grad_loss: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    denominator: torch.Tensor | None,
    grad: torch.Tensor,
    token_scaling: bool = False,
) -> None:
    """The gradient with ``grad_loss`` folded in before its one rounding, written into ``grad`` (may be
    ``logits``): the kernel again, with per-row gradient scales (the losses it computes are discarded)."""
    scale = grad_loss.reshape(-1).to(torch.float64)
    scale = scale.expand(logits.shape[0]) if scale.numel() == 1 else scale
    scale = scale.contiguous()  # the kernel reads one value per row at unit stride
    _forward_impl(
        logits, target, weight, grad, ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
        False, denominator, grad_scale=scale, token_scaling=token_scaling,
    )  # fmt: skip


_grad_in_backward = torch.library.custom_op(
    "liger_core::cross_entropy_grad_", _grad_in_backward_impl, mutates_args=("grad",)
)


@_grad_in_backward.register_fake
def _(*_, **__):
    return None


# ----------------------------------------------------------------------------------------------------------
# Autograd and the functional entry point
# ----------------------------------------------------------------------------------------------------------


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        logits,
        target,
        weight,
        ignore_index,
        reduction,
        label_smoothing,
        lse_square_scale,
        softcap,
        inplace,
        check_targets,
        denominator=None,
        token_scaling=False,
    ):
        args = (target, weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap)
        ctx.grad_consumed = False
        ctx.token_scaling = token_scaling
        if logits.dtype == torch.float16:
            # fp16: most gradient entries of a reduced loss (p / N) are subnormal, and scaling a stored
            # gradient by grad_output in backward would round them twice (a loss scaler's 2^16 then multiplies
            # what the first rounding lost: 1.9x eager's error on the H100 at 1031 x 32000, the case
            # tests/ops/test_cross_entropy.py checks). So the forward pass computes the losses only, and
            # backward runs the kernel with grad_output folded in: one more read of the logits, eager's single
            # rounding.
            loss, z, _ = launcher(_cross_entropy_fwd, _cross_entropy_fwd_impl)(
                logits, *args, False, check_targets, denominator, token_scaling
            )
            ctx.grad_in_backward = (args, denominator, inplace and not torch.compiler.is_compiling())
            ctx.save_for_backward(logits)
            ctx.mark_non_differentiable(z)
            return loss, z
        ctx.grad_in_backward = None
        # under torch.compile the traced graph stays functional (the compiler plans its own buffers)
        if inplace and not torch.compiler.is_compiling():
            loss, z = launcher(_cross_entropy_fwd_inplace, _cross_entropy_fwd_inplace_impl)(
                logits, *args, check_targets, denominator, token_scaling
            )
            # the logits now hold the gradient: autograd refuses any later use of the old values (another
            # node that saved them) with its "modified by an inplace operation" error
            torch.autograd.graph.increment_version(logits)
            grad = logits
        else:
            loss, z, grad = launcher(_cross_entropy_fwd, _cross_entropy_fwd_impl)(
                logits, *args, True, check_targets, denominator, token_scaling
            )
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(z)
        return loss, z

    @staticmethod
    def backward(ctx, grad_loss, _grad_z):
        if ctx.grad_consumed:
            raise RuntimeError(
                "cross_entropy: the stored gradient was consumed by the first backward (scaled in place); "
                "backward through it twice (retain_graph=True) is not supported"
            )
        if ctx.grad_in_backward is not None:
            (logits,) = ctx.saved_tensors
            args, denominator, inplace = ctx.grad_in_backward
            # in place, the logits become the gradient: a second backward would read it as logits
            ctx.grad_consumed = inplace
            grad = logits if inplace else torch.empty_like(logits, memory_format=torch.contiguous_format)
            target, weight, *options = args
            launcher(_grad_in_backward, _grad_in_backward_impl)(
                logits, target, weight, grad_loss, *options, denominator, grad, ctx.token_scaling
            )
            if inplace:  # another node that saved these logits must not read the gradient as logits
                torch.autograd.graph.increment_version(logits)
            return grad.detach(), *(None,) * 11
        ctx.grad_consumed = True
        (grad,) = ctx.saved_tensors
        launcher(_scale_rows, _scale_rows_impl)(grad, grad_loss)
        return grad.detach(), *(None,) * 11


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    return_z_loss: bool = False,
    *,
    options: CrossEntropyOptions | None = None,
    inplace_backward: bool = False,
    check_targets: bool = True,
    denominator: torch.Tensor | float | None = None,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    use_token_scaling: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | CrossEntropyOutput:
    """Cross-entropy of ``logits (..., V)`` (any strides) against class indices ``target (...)``, as
    ``torch.nn.functional.cross_entropy`` (class ``weight``, ``ignore_index``, ``label_smoothing``,
    ``reduction``), plus z-loss ``lse_square_scale * logsumexp(logits)^2`` per non-ignored token and Gemma-2
    logit softcapping ``softcap * tanh(logits / softcap)`` applied first.

    The gradient is computed in the forward pass (fp32 math, one rounding to the logits dtype); backward only
    scales it by ``grad_output``, per token for ``reduction="none"``. fp16 logits: computed in backward
    instead, with ``grad_output`` inside its one rounding (see the module doc).

    ``denominator`` (a number >= 0 or a 0-dim tensor, with ``reduction="sum"``): the sum divided by it, as
    Hugging Face's causal-LM loss divides by ``num_items_in_batch``; the division is in the stored gradient
    before its rounding and in the loss before its (dividing the returned loss would round both again).

    Returns the loss in fp32 whatever the logits' dtype (as Hugging Face's loss on upcast logits; a bf16 loss
    would carry a relative error of ~2e-3), or ``(loss, z_loss)`` when ``return_z_loss``: ``z_loss`` is the
    z-loss part of ``loss``, reduced the same way, for logging (it carries no gradient; ``loss`` already
    includes it). The gradient has the logits' dtype.

    ``reduction="mean"`` with nothing to average (no rows, every target ignored, or all non-ignored targets
    of class weight 0) gives torch's NaN (0 / 0); the gradient is then 0 where every target is ignored and
    NaN in non-ignored rows of class weight 0, as torch's. Non-finite logits: see the module doc.

    Departures from torch, on purpose:
      - ignored rows are never read: their gradient is 0 even where their logits hold NaN or +inf (torch's
        log_softmax backward multiplies their zero gradient by exp(NaN) there).
      - ``denominator=0`` gives a loss of 0 and zero gradients (Hugging Face's division would give NaN).
      - the z-loss is not multiplied by class weights; ``mean`` divides it by the non-ignored token count.

    ``inplace_backward=True`` writes the gradient into the logits buffer during the forward pass (fp16:
    during backward), ~0 extra memory instead of one logits-sized buffer. The caller promises that nothing
    reads ``logits`` afterwards: their values are gone (autograd's version counter still raises if another
    autograd node saved them).
    Use it where the logits are a temporary made for this loss (e.g. an fp32 upcast); the default never
    modifies ``logits``, nor does a call whose logits' rows share memory (an expanded tensor: the gradient
    then goes to a buffer of its own).

    Targets must lie in [0, V) or equal ``ignore_index``: a ValueError otherwise, found on the device and
    read back with one host sync after the kernels are queued. ``check_targets=False`` skips that sync for
    callers whose targets are known to be valid; an out-of-range target then gets a meaningless loss and
    gradient for its row (the kernel clamps the index: never an out-of-bounds access).

    ``options``: the loss options as one ``CrossEntropyOptions``, instead of the keywords (which then keep
    their defaults).

    Liger-Kernel's ``use_token_scaling`` (inside the kernel: each row's loss and gradient times its target's
    probability, a constant), ``return_token_accuracy`` and ``return_predicted_tokens`` (``argmax`` of the
    given logits, read once more before the kernel; the result is then a ``CrossEntropyOutput``): see
    ``CrossEntropyOptions``.
    """
    options = resolve_options(
        options, weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss,
        return_token_accuracy, return_predicted_tokens, use_token_scaling,
    )  # fmt: skip
    weight, ignore_index, reduction = options.weight, options.ignore_index, options.reduction
    check_tensor("logits", logits, min_ndim=1)
    check_tensor("target", target, dtypes=INDEX_DTYPES)
    check_shape("target", target, tuple(logits.shape[:-1]), "target must have the shape of logits[..., 0]")
    vocab = logits.shape[-1]
    if vocab == 0:
        raise ValueError("logits has a vocabulary (last) dimension of size 0")
    if weight is not None:
        check_tensor("weight", weight, dtypes=FLOAT_DTYPES + (torch.float64,))
        check_shape("weight", weight, (vocab,), "one weight per class")
    check_same_device("logits", logits, target=target, weight=weight)
    denominator = denominator_tensor(denominator, reduction, logits.device)

    if not use_triton(logits):
        check_targets_host(target.reshape(-1), ignore_index, vocab)  # same ValueError as the kernel path
        return reference.cross_entropy(logits, target, options=options, denominator=denominator)

    out_shape = target.shape
    logits2d = logits.reshape(-1, vocab)
    if logits2d.stride(1) != 1:
        logits2d = logits2d.contiguous()
    target1d = target.reshape(-1)
    if not target1d.is_contiguous():
        target1d = target1d.contiguous()
    if weight is not None:
        weight = weight.contiguous()
    if inplace_backward and logits2d.shape[0] > 1 and logits2d.stride(0) < vocab:
        # rows that share memory (e.g. an expanded tensor): the gradient of one would overwrite another's
        # logits, so it goes to a buffer of its own
        inplace_backward = False
    check_targets = bool(check_targets)
    argmax = None
    if options.wants_argmax:  # before the kernel, which may overwrite the logits with their gradient
        argmax = torch.where(target1d != ignore_index, logits2d.detach().argmax(-1), -1)
    scaling = options.use_token_scaling
    if torch.is_grad_enabled() and logits.requires_grad:
        loss, z = CrossEntropyFunction.apply(
            logits2d, target1d, weight, *options.row_options(), inplace_backward, check_targets, denominator,
            scaling,
        )  # fmt: skip
    else:  # no gradient wanted: one read of the logits, nothing written
        loss, z, _ = launcher(_cross_entropy_fwd, _cross_entropy_fwd_impl)(
            logits2d, target1d, weight, *options.row_options(), False, check_targets, denominator, scaling
        )
    if reduction == "none":
        loss, z = loss.view(out_shape), z.view(out_shape)
    return finish_outputs(options, loss, z, argmax, target)
