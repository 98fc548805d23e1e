"""Fused linear + cross-entropy: the lm_head matmul and the loss, without ever holding all the logits.

For hidden states ``h (BT, H)``, lm_head weight ``W (V, H)``, optional bias ``b (V,)``, the loss of
``cross_entropy(h @ W.T + b, target, ...)`` (every option of ``liger_core.ops.cross_entropy``) and its
gradients, computed in the forward pass by one of three loops (``_run_loop`` picks):

1. Two passes (the default): grad_hidden by chunks of tokens, grad_weight by slices of the vocabulary::

       grad_weight's storage (V x H) is allocated first; pass 1 works inside it
       pass 1, chunks of <= H tokens:  logits_c = h_c @ W.T (+ b)      (C, V) in dW's storage
                                       CE kernel(s)                    losses, dlogits_c in place, per-row
                                                                       gradient coefficients
                                       dh_c = dlogits_c @ W             one GEMM over all classes
    without a bias, the last K <= H: logits_K.T = W @ h_K.T          (V, K) vocabulary-major, kept
                                       _columns_stats/finish/grad      losses, dlogits_K.T in place
                                       dh_K = dlogits_K @ W
       pass 2, slices of V_s classes, the last slice first:
                                       logits_s = h_rest @ W_s.T        the other tokens' logits again
                                       _slice_grad_kernel               their dlogits from the coefficients
                                       dlogits_K[s] transposed below them (out of dW's rows s)
                                       dW_s = dlogits_s.T @ h           one GEMM over all tokens
                                       db_s = sum_rows(dlogits_s)

   Exact: every logit and gradient is one GEMM rounded once, as eager's (hence no kept chunk with a bias:
   cuBLAS adds a per-class bias to vocabulary-major logits only through its beta path, which rounds twice).
   FLOPs: 6 BT H V where every token is kept (BT <= H), 8 BT H V at most (the other tokens' logits computed
   twice). Peak extra memory: dW + dh + one slice (default: half the hidden-state gradient's size, >= 32 MiB
   on a GPU; ``max_chunk_bytes``). Rows s of dW are written over storage whose kept slice was just copied out;
   with the last slice first, every lower slice's kept gradient lies below them. H100, bf16, H 4096, V 128256,
   fwd+bwd, 8192 tokens: 45.2 ms GPU time at 1.07 GiB, 4096 tokens kept (``benchmarks/results/h100/ops.csv``,
   2026-11-24); a vocabulary-major loop without a kept chunk (fp32 dh across slices) takes 51.1 ms at 1.167
   GiB (``benchmarks/results/h100/flce_order_interleaved.log``, default budget).
2. Token-major with fp32 accumulators, where the memory headroom under the process's own earlier peak holds
   fp32 dW and dh, their rounded copies and a 512 MiB chunk (inside a training step, after its first
   iterations), or where ``max_chunk_bytes`` grants that much (4 bytes per element of W and h plus >= 512
   MiB of logits): chunks of ``C`` tokens, ``logits_c = h_c @ W.T``, CE kernel in place,
   ``dh_c = dlogits_c @ W``, ``dW += dlogits_c.T @ h_c`` into fp32, rounded once at the end. Exact, and
   faster there (no recomputed logits; Llama-1B shape, H100: 56.4k tokens/s vs 53.6k with the vocabulary
   order), at no new peak. H100, 8192 tokens, H 4096, V 128256 bf16: 36.6 ms of GPU kernels in one profiled
   fwd+bwd, at ~3.1 GiB extra (script at 0aa2349: ``python benchmarks/variants_ce.py --only profile``).
   With every logit in the budget (``max_chunk_bytes`` >= tokens x V x 2 bytes, or that much headroom):
   one chunk, nothing accumulated.
3. Token-major in ``accum_dtype`` (default W's dtype) when ``chunk_size`` is given: a bf16 dW rounds once per
   chunk (error up to ~sqrt(chunks) x eager's; Liger-Kernel's default order), each chunk reads W twice and
   reads and writes dW once (~4 |W| bytes). Faster than 1. at small vocabularies (V 32000, 8191 tokens: 10.4
   ms in liger-kernel's version vs 13.0 for 1.), less exact.

The backward pass only scales the stored gradients by ``grad_output`` (free when it is 1; otherwise the stored
bf16 gradients round a second time: ``accum_dtype=torch.float32`` keeps them in fp32 until then, for 2 more
bytes per element of W and h). ``reduction="none"`` cannot fold per-token ``grad_output`` into gradients
computed before it is known, so its forward computes only the losses and its backward runs the loop again with
the per-token factors inside the kernel.
"""

from __future__ import annotations

import inspect

import torch

from liger_core import reference, tuning
from liger_core.dispatch import (
    FLOAT_DTYPES,
    check_same_device,
    check_shape,
    check_tensor,
    launcher,
    use_triton,
)
from liger_core.loss_options import CrossEntropyOptions, CrossEntropyOutput, finish_outputs
from liger_core.loss_options import resolve as resolve_options
from liger_core.ops._ce_math import (
    _scale_rows,
    _scale_rows_impl,
    check_targets_host,
    denominator_tensor,
    reduce_losses,
)
from liger_core.ops._chunked_linear import (
    LinearLossArgs,
    _accum_dtype,
    _chunk_loop,
    _empty,
    _fake_grads,
    _gradient_elements,
    _grads_in_dtypes,
    _headroom,
    autocast_linear_inputs,
    check_chunk_options,
    check_linear_inputs,
    choose_chunk_tokens,
    flatten_for_chunks,
    hidden_accum_dtype,
    wants_grad,
)
from liger_core.ops._flce_two_pass import _two_pass_loop
from liger_core.sharding import any_dtensor, check_not_zero3_partitioned, gather_weights


def _run_loop(args: LinearLossArgs, chunk_size: int | None, max_chunk_bytes: int | None, **kwargs):
    """Which loop computes the loss and gradients:

    - ``chunk_size`` given: the token-major chunk loop with that many tokens per chunk (dW accumulates in
      ``accum_dtype``: a bf16 dW rounds once per chunk);
    - otherwise (16-bit inputs, gradients wanted), where ``max_chunk_bytes`` or the process's memory
      headroom (below its own earlier peak, so no new peak) holds every logit: the token-major loop in one
      chunk (exact: each gradient is one GEMM; the fastest order);
    - otherwise, where the headroom holds fp32 dW and dh accumulators, their rounded copies and a large
      chunk, or ``max_chunk_bytes`` the fp32 accumulators and a HEADROOM_CHUNK_BYTES chunk: the token-major
      loop with fp32 accumulation, rounded once at the end (exact, faster than the two-pass loop);
    - otherwise the two-pass loop (exact; ``max_chunk_bytes`` bounds its vocabulary slice).

    Argmax rows or token scaling (``kwargs``) come from the looped row kernel of the token-major loop: with
    ``chunk_size`` as above, otherwise with fp32 accumulators (exact)."""
    extras = kwargs.get("argmax_rows") is not None or kwargs.get("token_scaling", False)
    if chunk_size is not None:
        tuning.LOOP_COUNTS["token-major"] += 1
        return _chunk_loop(args, chunk_size, **kwargs)
    hidden, weight, accum_dtype = args.hidden, args.weight, args.accum_dtype
    need_hidden, need_weight = args.need_hidden, args.need_weight
    n_tokens, vocab = hidden.shape[0], weight.shape[0]
    elements = _gradient_elements(hidden, weight, need_hidden, need_weight)
    all_logits = n_tokens * vocab * hidden.element_size()
    fp32_loop, fp32_chunk = False, None  # fp32_chunk None: the headroom chunk (choose_chunk_tokens)
    if extras:
        fp32_loop = True
    elif hidden.dtype == torch.float32 or not (need_hidden or need_weight):
        pass  # the two-pass loop: fp64 products for fp32 inputs; one pass for losses alone
    elif max_chunk_bytes is None:
        headroom = _headroom(hidden.device)  # one query: host time on every call
        if headroom >= all_logits + elements * hidden.element_size():
            # every logit at once, below the process's earlier peak: one chunk, nothing accumulated
            tuning.LOOP_COUNTS["token-major one chunk"] += 1
            return _chunk_loop(args, n_tokens, **kwargs)
        # fp32 accumulators, the gradients they are rounded to at the end (both alive then), a chunk
        fp32_loop = headroom >= elements * (4 + hidden.element_size()) + tuning.HEADROOM_CHUNK_BYTES
    elif max_chunk_bytes >= all_logits:
        # the budget holds every logit: one chunk, each gradient one GEMM rounded once (as eager), no
        # accumulation and no recomputed logits: the fastest exact order
        tuning.LOOP_COUNTS["token-major one chunk"] += 1
        return _chunk_loop(args, n_tokens, **kwargs)
    elif max_chunk_bytes - 4 * elements >= tuning.HEADROOM_CHUNK_BYTES:
        # a budget that holds fp32 accumulators and a large chunk: the token order, exact, faster than the
        # two-pass loop's recomputed logits
        fp32_loop = True
        fp32_chunk = choose_chunk_tokens(
            n_tokens, hidden.shape[1], vocab, hidden.dtype, hidden.device,
            max_chunk_bytes=max_chunk_bytes - 4 * elements,
        )  # fmt: skip
    if fp32_loop:
        tuning.LOOP_COUNTS["token-major fp32"] += 1
        loss_rows, z_rows, stats, gh, gw, gb = _chunk_loop(
            args._replace(accum_dtype=torch.float32), fp32_chunk, **kwargs
        )
        gh = gh.to(hidden_accum_dtype(hidden, weight, accum_dtype)) if gh is not None else None
        gw = gw.to(_accum_dtype(accum_dtype, weight)) if gw is not None else None
        return loss_rows, z_rows, stats, gh, gw, gb
    tuning.LOOP_COUNTS["two-pass"] += 1
    return _two_pass_loop(args, max_chunk_bytes, **kwargs)


def _problem(values: dict, **changes) -> LinearLossArgs:
    """The ``LinearLossArgs`` that a custom op's arguments name: ``values`` maps the parameter names of
    ``_flce_fwd_impl`` / ``_flce_bwd_rows_impl`` to their values (an impl's ``locals()`` on entry, a fake's
    ``_arguments``), ``changes`` overrides some (a field that the op does not take)."""
    values = {**values, **changes}
    return LinearLossArgs(*(values[name] for name in LinearLossArgs._fields))


def _arguments(impl, args: tuple, kwargs: dict) -> dict:
    """``impl``'s parameters by name, defaults filled in, for the call ``impl(*args, **kwargs)``: the fake
    implementations take every argument of their op without writing its list a second time."""
    bound = inspect.signature(impl).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _flce_fwd_impl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ce_weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    need_hidden: bool,
    need_weight: bool,
    need_bias: bool,
    accum_dtype: torch.dtype | None,
    chunk_size: int | None,
    check_targets: bool = True,
    max_chunk_bytes: int | None = None,
    denominator: torch.Tensor | None = None,
    return_argmax: bool = False,
    token_scaling: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, z_loss, grad_hidden and grad_weight [accumulation dtype], grad_bias [fp32], argmax [int64,
    per token, -1 on ignored tokens]); gradients not requested and the argmax without ``return_argmax`` are
    empty. ``denominator`` (0-dim fp64, with reduction "sum"): the sum divided by it, computed as a "mean"
    whose denominator it is, so the gradients carry the division before their one rounding.
    ``token_scaling``: Liger-Kernel's per-token scaling (``CrossEntropyOptions.use_token_scaling``)."""
    if denominator is not None:
        reduction = "mean"
    args = _problem(locals())
    with torch.autocast(hidden.device.type, enabled=False):
        argmax = None
        extras: dict = {}
        if return_argmax:
            argmax = torch.empty(hidden.shape[0], dtype=torch.int64, device=hidden.device)
            extras["argmax_rows"] = argmax
        if token_scaling:
            extras["token_scaling"] = True
        loss_rows, z_rows, stats, gh, gw, gb = _run_loop(
            args, chunk_size, max_chunk_bytes, check_targets=check_targets, denominator=denominator, **extras
        )
        loss, z = reduce_losses(loss_rows, z_rows, stats, reduction)
    return (
        loss,
        z,
        gh if gh is not None else _empty(hidden),
        gw if gw is not None else _empty(weight),
        gb if gb is not None else _empty(hidden).float(),
        argmax if argmax is not None else target.new_empty(0, dtype=torch.int64),
    )


# Custom ops for torch.compile; eager mode calls the *_impl functions (see cross_entropy.py)
_flce_fwd = torch.library.custom_op(
    "liger_core::fused_linear_cross_entropy_fwd", _flce_fwd_impl, mutates_args=()
)


@_flce_fwd.register_fake
def _(*args, **kwargs):
    values = _arguments(_flce_fwd_impl, args, kwargs)
    hidden, weight, target, reduction, accum_dtype = (
        values[name] for name in ("hidden", "weight", "target", "reduction", "accum_dtype")
    )
    need_hidden, need_weight, need_bias = values["need_hidden"], values["need_weight"], values["need_bias"]
    shape = (hidden.shape[0],) if reduction == "none" else ()
    f32 = dict(dtype=torch.float32)
    accum = _accum_dtype(accum_dtype, weight)
    return (
        hidden.new_empty(shape, **f32),
        hidden.new_empty(shape, **f32),
        hidden.new_empty(hidden.shape, dtype=hidden_accum_dtype(hidden, weight, accum_dtype))
        if need_hidden
        else _empty(hidden),
        weight.new_empty(weight.shape, dtype=accum) if need_weight else _empty(weight),
        hidden.new_empty(weight.shape[0], **f32) if need_bias else _empty(hidden).float(),
        target.new_empty(hidden.shape[0] if values["return_argmax"] else 0, dtype=torch.int64),
    )


def _flce_bwd_rows_impl(
    grad_rows: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ce_weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    need_hidden: bool,
    need_weight: bool,
    need_bias: bool,
    accum_dtype: torch.dtype | None,
    chunk_size: int | None,
    max_chunk_bytes: int | None = None,
    token_scaling: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """reduction="none" backward: the loop again with one grad_output per token inside the kernel;
    gradients in the dtypes of hidden, weight and bias (empty where not requested)."""
    args = _problem(locals(), reduction="none")
    with torch.autocast(hidden.device.type, enabled=False):
        extras = {"token_scaling": True} if token_scaling else {}
        *_, gh, gw, gb = _run_loop(
            args, chunk_size, max_chunk_bytes, row_scale=grad_rows.contiguous(), **extras
        )
    return _grads_in_dtypes((gh, gw, gb), hidden, weight, bias)


_flce_bwd_rows = torch.library.custom_op(
    "liger_core::fused_linear_cross_entropy_bwd_rows", _flce_bwd_rows_impl, mutates_args=()
)


@_flce_bwd_rows.register_fake
def _(*args, **kwargs):
    values = _arguments(_flce_bwd_rows_impl, args, kwargs)
    return _fake_grads(
        *(values[name] for name in ("hidden", "weight", "bias", "need_hidden", "need_weight", "need_bias"))
    )


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        target,
        bias,
        ce_weight,
        ignore_index,
        reduction,
        label_smoothing,
        lse_square_scale,
        softcap,
        accum_dtype,
        chunk_size,
        check_targets,
        max_chunk_bytes,
        denominator=None,
        return_argmax=False,
        token_scaling=False,
    ):
        need_hidden, need_weight, _, need_bias = ctx.needs_input_grad[:4]
        need_bias = need_bias and bias is not None
        ctx.needs = (need_hidden, need_weight, need_bias)
        ctx.options = (ignore_index, label_smoothing, lse_square_scale, softcap)
        ctx.accum = (accum_dtype, chunk_size, max_chunk_bytes, token_scaling)
        ctx.reduction = reduction
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.grad_consumed = False
        # reduction "none": the forward computes the losses alone, its backward runs the loop again
        rows = reduction == "none"
        loss, z, gh, gw, gb, argmax = launcher(_flce_fwd, _flce_fwd_impl)(
            hidden, weight, target, bias, ce_weight, ignore_index, reduction, label_smoothing,
            lse_square_scale, softcap, *((False,) * 3 if rows else ctx.needs), accum_dtype, chunk_size,
            check_targets, max_chunk_bytes, None if rows else denominator, return_argmax, token_scaling,
        )  # fmt: skip
        if rows:
            ctx.save_for_backward(hidden, weight, target, bias, ce_weight)
        else:
            ctx.save_for_backward(gh, gw, gb)
        ctx.mark_non_differentiable(z, argmax)
        return loss, z, argmax

    @staticmethod
    def backward(ctx, grad_loss, _grad_z, _grad_argmax):
        need_hidden, need_weight, need_bias = ctx.needs
        if ctx.reduction == "none":
            hidden, weight, target, bias, ce_weight = ctx.saved_tensors
            gh, gw, gb = launcher(_flce_bwd_rows, _flce_bwd_rows_impl)(
                grad_loss,
                hidden,
                weight,
                target,
                bias,
                ce_weight,
                *ctx.options,
                need_hidden,
                need_weight,
                need_bias,
                *ctx.accum,
            )
        else:
            if ctx.grad_consumed:
                raise RuntimeError(
                    "fused_linear_cross_entropy: the gradients stored in forward were scaled in place "
                    "by the first backward; backward through it twice (retain_graph=True) is not supported"
                )
            ctx.grad_consumed = True
            gh, gw, gb = ctx.saved_tensors
            hidden_dtype, weight_dtype, bias_dtype = ctx.dtypes
            for grad, needed in ((gh, need_hidden), (gw, need_weight), (gb, need_bias)):
                if needed:
                    launcher(_scale_rows, _scale_rows_impl)(grad, grad_loss)  # in place; free when it is 1
            # one rounding to the parameter dtype after the scaling (a no-op without accum_dtype)
            gh = gh.to(hidden_dtype) if need_hidden else gh
            gw = gw.to(weight_dtype) if need_weight else gw
            gb = gb.to(bias_dtype) if need_bias else gb
        return (
            gh if need_hidden else None,
            gw if need_weight else None,
            None,
            gb if need_bias else None,
            *(None,) * 13,  # ce_weight, the options, denominator, return_argmax, token_scaling
        )


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    return_z_loss: bool = False,
    ce_weight: torch.Tensor | None = None,
    accum_dtype: torch.dtype | None = None,
    *,
    options: CrossEntropyOptions | None = None,
    chunk_size: int | None = None,
    max_chunk_bytes: int | None = None,
    check_targets: bool = True,
    denominator: torch.Tensor | float | None = None,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    use_token_scaling: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | CrossEntropyOutput:
    """``cross_entropy(hidden @ weight.T + bias, target, ...)`` without materialising the (tokens, V) logits.

    hidden ``(..., H)``, weight ``(V, H)`` (lm_head layout), bias ``(V,)``, target ``(...)``, all of any
    strides; ``ce_weight`` are the cross-entropy class weights. Every loss option is that of
    ``liger_core.ops.cross_entropy`` (same semantics, same departures from torch: a mean over nothing is
    torch's NaN, ignored tokens' logits get a zero gradient whatever they hold, non-finite logits give
    torch's results). ``denominator`` (a number >= 0 or a 0-dim tensor, with ``reduction="sum"``): the
    loss is the sum divided by it, as Hugging Face's causal-LM loss divides by ``num_items_in_batch``; the op
    divides before the gradients stored in forward are rounded, where dividing the returned loss would round
    them a second time in backward (0 gives a loss of 0 and zero gradients, where the division gives NaN).

    Returns an fp32 loss (as Hugging Face's loss on upcast logits), or ``(loss, z_loss)``. The default
    computes every gradient at eager's accuracy (two-pass loop, see the module doc). ``accum_dtype``:
    dtype of the stored gradients (default: weight's dtype; ``torch.float32`` keeps them exact through a
    ``grad_output`` other than 1, at 2 more bytes per element of weight and hidden). ``max_chunk_bytes``: a
    bound on the working memory beside the gradients (default: half the hidden-state gradient's size, >= 32
    MiB on a GPU): the vocabulary slice of the two-pass loop; a budget that holds every logit selects one
    token-major chunk (each gradient one GEMM), and one that holds fp32 copies of the gradients (4 bytes per
    element of weight and hidden) plus >= 512 MiB of logits the token-major loop with fp32 accumulators:
    exact like the default, and faster (numbers in the module doc). ``chunk_size``:
    tokens per chunk in the token-major loop instead (a bf16 dW then rounds once per chunk, as
    Liger-Kernel's; faster at small vocabularies). ``check_targets``: as in
    ``cross_entropy``. Tied weights work (autograd adds this gradient to the embedding's). Under autocast,
    hidden/weight/bias are cast to the autocast dtype first, as ``F.linear`` would be.

    ``options``: the loss options as one ``CrossEntropyOptions`` (its ``weight`` is ``ce_weight``),
    instead of the keywords (which then keep their defaults).

    Liger-Kernel's ``return_token_accuracy``, ``return_predicted_tokens`` (from the row kernel's first pass:
    no logits kept) and ``use_token_scaling`` (see ``CrossEntropyOptions``): computed by the token-major loop
    (``chunk_size``, else fp32 accumulators); with either output the result is a ``CrossEntropyOutput``.
    """
    options = resolve_options(
        options, ce_weight, ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
        return_z_loss, return_token_accuracy, return_predicted_tokens, use_token_scaling,
    )  # fmt: skip
    ce_weight, ignore_index, reduction = options.weight, options.ignore_index, options.reduction
    if any_dtensor(hidden, weight, bias, target):
        inputs = {"hidden": hidden, "target": target}
        gathered = gather_weights("fused_linear_cross_entropy", inputs, {"weight": weight, "bias": bias})
        weight, bias = gathered["weight"], gathered["bias"]
    check_not_zero3_partitioned(weight=weight, bias=bias)
    _, vocab = check_linear_inputs(hidden, weight, target, bias)
    if ce_weight is not None:
        check_tensor("ce_weight", ce_weight, dtypes=FLOAT_DTYPES + (torch.float64,))
        check_shape("ce_weight", ce_weight, (vocab,), "one class weight per vocabulary entry")
    check_same_device("hidden", hidden, weight=weight, target=target, bias=bias, ce_weight=ce_weight)
    check_chunk_options(accum_dtype, chunk_size, max_chunk_bytes)
    denominator = denominator_tensor(denominator, reduction, hidden.device)
    hidden, weight, bias = autocast_linear_inputs(hidden, weight, bias)

    if not use_triton(hidden):
        check_targets_host(target.reshape(-1), ignore_index, vocab)  # same ValueError as the kernel path
        return reference.fused_linear_cross_entropy(
            hidden, weight, target, bias, options=options, accum_dtype=accum_dtype, denominator=denominator
        )

    out_shape = target.shape
    extras = (options.wants_argmax, options.use_token_scaling)
    # max_chunk_bytes stays a byte budget: it bounds the two-pass loop's vocabulary slice
    hidden2d, target1d, chunk_size = flatten_for_chunks(hidden, weight, target, chunk_size, None)
    ce_weight = ce_weight.contiguous() if ce_weight is not None else None
    if wants_grad(hidden, weight, bias):
        loss, z, argmax = FusedLinearCrossEntropyFunction.apply(
            hidden2d,
            weight,
            target1d,
            bias,
            ce_weight,
            *options.row_options(),
            accum_dtype,
            chunk_size,
            bool(check_targets),
            max_chunk_bytes,
            denominator,
            *extras,
        )
    else:  # evaluation: losses only, no gradient GEMMs
        loss, z, *_, argmax = launcher(_flce_fwd, _flce_fwd_impl)(
            hidden2d,
            weight,
            target1d,
            bias,
            ce_weight,
            *options.row_options(),
            False,
            False,
            False,
            accum_dtype,
            chunk_size,
            bool(check_targets),
            max_chunk_bytes,
            denominator,
            *extras,
        )
    if reduction == "none":
        loss, z = loss.view(out_shape), z.view(out_shape)
    return finish_outputs(options, loss, z, argmax if options.wants_argmax else None, target)
