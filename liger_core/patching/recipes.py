"""Per-model knowledge, as data: which classes and functions of ``transformers.models.<m>.modeling_<m>`` the
patcher swaps for each ``model_type``, and with which semantics.

One generic patcher (``instance.py`` for a built model, ``class_level.py`` before it is built) consumes this
table; adding a model is adding a row. Each row was checked against the modeling source of transformers 5.23
(the dev venv) and must stay valid for 5.17 (the GPU machine): only names present in both are used.

Norm semantics (see ``liger_core.reference.rms_norm`` for the exact rounding of each casting mode):

=================  ======  ============  ========  ==================================================
family             offset  casting_mode  in_place  why
=================  ======  ============  ========  ==================================================
Llama and kin      0.0     "llama"       True      ``w * (x.float() * rstd).to(dt)``; pre-norm only
Gemma              1.0     "gemma"       True      ``(x.float() * rstd * (1 + w.float())).to(dt)``
Gemma-2 / Gemma-3  1.0     "gemma"       False     post-norms: ``residual + norm(h)`` hands the norm the
                                                   same dy tensor the residual branch still needs
                                                   (Liger-Kernel issue #370), so dx must not overwrite dy
OLMo-2             0.0     "gemma"       False     ``(w * x.float() * rstd).to(dt)``; post-norms as above
=================  ======  ============  ========  ==================================================

MLPs: the activation is not taken from this table but recognised on each built module by a numeric probe of
its ``act_fn`` (silu -> SwiGLU, tanh-GELU -> GeGLU, exact GELU -> GeGLU(approximate="none")), because it comes
from ``config.hidden_act`` and a Llama-architecture checkpoint may use any of them. ``activation`` below is
only what the architecture's reference checkpoints use (documentation, and what the tests exercise).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NormSpec:
    """An RMSNorm class and how it rounds; ``eps`` comes from the module (``variance_epsilon``/``eps``).

    ``group_size``: each row is normalised in groups of that many features (``liger_core.ops.rms_norm``'s
    ``group_size``). ``heads_input``: the module takes (..., heads, head_dim), normalises each head, and
    returns (..., heads * head_dim) (its weight covers all heads: ``group_size`` is head_dim).
    """

    class_name: str
    offset: float = 0.0
    casting_mode: str = "llama"
    in_place: bool = True
    group_size: int | None = None
    heads_input: bool = False


@dataclass(frozen=True)
class MLPSpec:
    """A gated MLP class: ``down(act(gate(x)) * up(x))``.

    ``gate_up`` names a fused projection whose output is split in half (Phi-3:
    ``gate, up = gate_up(x).chunk(2)``); otherwise ``gate``/``up`` name the two projections. The patched
    forward still calls these submodules, so LoRA (or any wrapper) on them keeps working: only the
    activation-times-up math is swapped.
    """

    class_name: str
    activation: str = "swiglu"  # "swiglu" | "geglu": what reference checkpoints use (see module docstring)
    act: str = "act_fn"
    gate: str | None = "gate_proj"
    up: str | None = "up_proj"
    down: str = "down_proj"
    gate_up: str | None = None


@dataclass(frozen=True)
class Recipe:
    model_type: str
    module: str  # modeling module, imported lazily
    causal_lm: str  # the *ForCausalLM class whose forward gets the fused linear + cross-entropy loss
    norms: tuple[NormSpec, ...] = ()
    mlps: tuple[MLPSpec, ...] = ()
    rope: str | None = "apply_rotary_pos_emb"  # module-level function the attention forward calls
    rope_casts_back: bool = (
        False  # the HF function returns q/k in their input dtype (OLMo-2: cos/sin are fp32)
    )
    softcap_attr: str | None = None  # config attribute: logits = c * tanh(logits / c)
    logits_scaling_attr: str | None = None  # config attribute: logits = logits / s (Granite)
    logits_multiplier_attr: str | None = None  # config attribute: logits = logits * m (Cohere)
    moe: bool = False  # forward adds router_aux_loss_coef * load_balancing_loss_func(...) when asked
    notes: tuple[str, ...] = field(default=())  # what is deliberately not patched, reported as "skipped"


_LLAMA_NORM = dict(offset=0.0, casting_mode="llama", in_place=True)


def _llama_like(model_type: str, prefix: str, *, module: str | None = None, **extra) -> Recipe:
    """A Llama-architecture row: ``<Prefix>RMSNorm`` (llama casting), ``<Prefix>MLP`` (SwiGLU), HF rope."""
    name = module or model_type
    return Recipe(
        model_type=model_type,
        module=f"transformers.models.{name}.modeling_{name}",
        causal_lm=f"{prefix}ForCausalLM",
        norms=(NormSpec(f"{prefix}RMSNorm", **_LLAMA_NORM),),
        mlps=extra.pop("mlps", (MLPSpec(f"{prefix}MLP"),)),
        **extra,
    )


RECIPES: dict[str, Recipe] = {
    r.model_type: r
    for r in (
        _llama_like("llama", "Llama"),
        _llama_like("mistral", "Mistral"),
        # Mixtral: every layer is sparse (MixtralExperts: 3-D fused gate_up/down weights), no dense MLP.
        _llama_like("mixtral", "Mixtral", mlps=(), moe=True),
        _llama_like("qwen2", "Qwen2"),
        # Qwen3: q_norm/k_norm are Qwen3RMSNorm over head_dim, patched like every other norm.
        _llama_like("qwen3", "Qwen3"),
        # Qwen3-MoE: Qwen3MoeMLP is the dense MLP of `mlp_only_layers` (and decoder_sparse_step gaps).
        _llama_like("qwen3_moe", "Qwen3Moe", moe=True),
        Recipe(
            model_type="gemma",
            module="transformers.models.gemma.modeling_gemma",
            causal_lm="GemmaForCausalLM",
            norms=(NormSpec("GemmaRMSNorm", offset=1.0, casting_mode="gemma", in_place=True),),
            mlps=(MLPSpec("GemmaMLP", activation="geglu"),),
        ),
        Recipe(
            model_type="gemma2",
            module="transformers.models.gemma2.modeling_gemma2",
            causal_lm="Gemma2ForCausalLM",
            norms=(NormSpec("Gemma2RMSNorm", offset=1.0, casting_mode="gemma", in_place=False),),
            mlps=(MLPSpec("Gemma2MLP", activation="geglu"),),
            softcap_attr="final_logit_softcapping",
        ),
        Recipe(
            model_type="gemma3_text",
            module="transformers.models.gemma3.modeling_gemma3",
            causal_lm="Gemma3ForCausalLM",
            norms=(NormSpec("Gemma3RMSNorm", offset=1.0, casting_mode="gemma", in_place=False),),
            mlps=(MLPSpec("Gemma3MLP", activation="geglu"),),
            softcap_attr="final_logit_softcapping",
        ),
        # Phi-3: fused gate_up_proj; its apply_rotary_pos_emb does partial rotary (cos narrower than head),
        # which liger_core.ops.rope handles natively.
        _llama_like(
            "phi3",
            "Phi3",
            mlps=(MLPSpec("Phi3MLP", act="activation_fn", gate=None, up=None, gate_up="gate_up_proj"),),
        ),
        # Granite: logits = lm_head(h) / logits_scaling; the fused loss uses (h / s) @ W^T, the same logits.
        _llama_like("granite", "Granite", logits_scaling_attr="logits_scaling"),
        Recipe(
            model_type="olmo2",
            module="transformers.models.olmo2.modeling_olmo2",
            causal_lm="Olmo2ForCausalLM",
            norms=(NormSpec("Olmo2RMSNorm", offset=0.0, casting_mode="gemma", in_place=False),),
            mlps=(MLPSpec("Olmo2MLP"),),
            rope_casts_back=True,
        ),
        # SmolLM3: NoPE layers (use_rope=False) skip the rope call inside the same attention forward.
        _llama_like("smollm3", "SmolLM3"),
    )
}


def recipe_model_types() -> list[str]:
    """The ``model_type`` values with a recipe: class-level patching (``apply_liger_kernel_to``) and
    per-recipe instance patching."""
    return sorted(RECIPES)


def supported_model_types() -> list[str]:
    """The ``model_type`` values that ``apply_liger_kernel`` is known to patch exactly.

    Supported means: the type has a recipe, or the model zoo (``tests/patching/zoo.py``) patched a tiny
    random model of it on the transformers release named by ``coverage()["transformers"]`` and the patched
    model's loss and every parameter gradient equalled the unpatched model's (fp32, one training step; for a
    type with a separate image-text-to-text class, both classes). A supported type may still leave kernels
    out where its modules have no liger_core equivalent: ``model_coverage(model_type)["missing"]`` names each
    with its reason, as ``PatchReport.missing`` does at patch time. Types not listed are still patched
    structurally (every swap checked numerically on a probe), without that end-to-end proof.
    """
    from liger_core.patching.coverage_data import zoo_exact_types

    return sorted(set(RECIPES) | set(zoo_exact_types()))
