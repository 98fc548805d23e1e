"""Built locally (no downloads): a tiny random-init Llama and a byte-level BPE tokenizer, a tiny Qwen2.5-VL
with image inputs in the processor's layout; Trainer helpers."""

from __future__ import annotations

import os
from pathlib import Path

import torch

ACTIVATION_ENV = "LIGER_CORE_DISABLE_HOOK"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a subprocess test: this one without the switch that turns the plugin's `.pth`
    activation off in the pytest process (conftest.py), so the child runs as a user's process does."""
    env = {k: v for k, v in os.environ.items() if k != ACTIVATION_ENV}
    env.update(TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **extra)
    return env


SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Fused kernels keep the logits out of memory.",
    "A tiny model is enough to check the wiring.",
    "Gradient accumulation must match one large batch.",
    "RMSNorm, RoPE and SwiGLU run in Triton.",
    "The trainer patches the model before the optimizer.",
    "Short one.",
    "Evaluation with only the loss skips the logits entirely, which saves memory.",
]


def build_tokenizer(directory: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.save_pretrained(directory)
    return fast


def llama_config(tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


MAX_TOKENS = 9  # RoPE and the fused loss are slow in Triton's interpreter: keep sequences short


def make_trainer(
    model, tokenizer, rows, output_dir, *, callbacks=None, model_init=None, data_collator=None, **overrides
):
    """A CPU Trainer over `rows` in order (two runs see the same batches), no checkpoints, no reports.
    `data_collator` defaults to causal-LM padding with `tokenizer`."""
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    settings = dict(
        output_dir=str(output_dir),
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        train_sampling_strategy="sequential",
        disable_tqdm=True,
        seed=0,
    )
    settings.update(overrides)
    return Trainer(
        model=model,
        model_init=model_init,
        args=TrainingArguments(**settings),
        train_dataset=rows,
        eval_dataset=rows[:4],
        data_collator=data_collator or DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=callbacks,
    )


def step_losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def kinds(model) -> set[str]:
    """The liger_core kinds `model` runs now (`liger_core.patching.patched_modules`)."""
    from liger_core.patching import patched_modules

    return set(patched_modules(model).values())


def toy_model():
    """A causal LM that liger_core cannot patch: unknown model_type, no norm, no gated MLP, no attention."""
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutput

    class ToyConfig(PretrainedConfig):
        model_type = "toy_unpatchable"

        def __init__(self, vocab=50, width=8, **kwargs):
            self.vocab, self.width = vocab, width
            super().__init__(**kwargs)

    class ToyLM(PreTrainedModel):
        config_class = ToyConfig

        def __init__(self, config):
            super().__init__(config)
            self.table = nn.Embedding(config.vocab, config.width)
            self.proj = nn.Linear(config.width, config.vocab)
            self.post_init()

        def forward(self, input_ids=None, labels=None, **kwargs):
            logits = self.proj(torch.tanh(self.table(input_ids)))
            loss = None
            if labels is not None:
                loss = nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100
                )
            return CausalLMOutput(loss=loss, logits=logits)

    return ToyLM(ToyConfig())


# ---------------------------------------------------------------------------------------------------------
# A tiny Qwen2.5-VL trained on images. No tokenizer or image processor is needed (the image processor wants
# torchvision and Pillow): the rows hold what Qwen2VLProcessor returns, built here in the same layout.

VLM_VOCAB = 128
VLM_PAD, VLM_EOS = 3, 2
IMAGE_TOKEN, VISION_START, VISION_END, VIDEO_TOKEN = 124, 125, 126, 127
PATCH, TEMPORAL_PATCH, MERGE = 2, 2, 2


def qwen2_5_vl_model(seed: int = 0):
    """A random-init Qwen2_5_VLForConditionalGeneration (float32): text 2 layers, hidden 32, 4 heads / 2 kv
    heads (head_dim 8, M-RoPE sections 1+1+2); vision 2 blocks (one windowed, one full attention), hidden 32,
    2x2-pixel patches merged 2x2 into one image token. The vision tower has RMSNorms and a SiLU-gated MLP too,
    so images go through kernels as well."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=VLM_VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[1, 1, 2]),
            bos_token_id=1,
            eos_token_id=VLM_EOS,
            pad_token_id=VLM_PAD,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=48,
            num_heads=4,
            patch_size=PATCH,
            temporal_patch_size=TEMPORAL_PATCH,
            spatial_merge_size=MERGE,
            window_size=4 * PATCH * MERGE,
            out_hidden_size=32,
            fullatt_block_indexes=[1],
        ),
        image_token_id=IMAGE_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        video_token_id=VIDEO_TOKEN,
    )
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).float()


def image_patches(image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`pixel_values` and `image_grid_thw` of one still image (channels, height, width), in the layout of
    Qwen2VLImageProcessor: the frame repeated over the temporal patch, patches ordered so that each 2x2 group
    merged into one token is contiguous, each patch flattened as (channel, time, row, column)."""
    channels, height, width = image.shape
    rows, cols = height // PATCH, width // PATCH
    frames = image.unsqueeze(0).expand(TEMPORAL_PATCH, channels, height, width)
    x = frames.reshape(TEMPORAL_PATCH, channels, rows // MERGE, MERGE, PATCH, cols // MERGE, MERGE, PATCH)
    x = x.permute(2, 5, 3, 6, 1, 0, 4, 7)
    return x.reshape(rows * cols, channels * TEMPORAL_PATCH * PATCH * PATCH), torch.tensor([1, rows, cols])


def image_rows(sizes: list[tuple[int, int, int]], seed: int = 1) -> list[dict]:
    """One row per (height, width, text tokens): a random image, then random text and EOS. `input_ids` hold
    the image as the processor expands it: vision start, one image token per merged 2x2 patch group, vision
    end."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for height, width, n_text in sizes:
        pixel_values, grid_thw = image_patches(torch.rand(3, height, width, generator=generator))
        n_image = int(grid_thw.prod()) // (MERGE * MERGE)
        text = torch.randint(4, IMAGE_TOKEN, (n_text,), generator=generator).tolist()
        ids = [VISION_START] + [IMAGE_TOKEN] * n_image + [VISION_END] + text + [VLM_EOS]
        rows.append(dict(input_ids=ids, pixel_values=pixel_values, image_grid_thw=grid_thw))
    return rows


def collate_images(rows: list[dict]) -> dict:
    """Right-padded `input_ids`/`attention_mask`; `labels` are the text tokens (image, vision markers and
    padding ignored); the images of the batch concatenated as the processor does."""
    length = max(len(r["input_ids"]) for r in rows)
    input_ids = torch.full((len(rows), length), VLM_PAD)
    attention_mask = torch.zeros_like(input_ids)
    for i, r in enumerate(rows):
        input_ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        attention_mask[i, : len(r["input_ids"])] = 1
    not_text = (attention_mask == 0) | (input_ids == IMAGE_TOKEN) | (input_ids == VISION_START)
    not_text |= input_ids == VISION_END
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        labels=input_ids.masked_fill(not_text, -100),
        pixel_values=torch.cat([r["pixel_values"] for r in rows]),
        image_grid_thw=torch.stack([r["image_grid_thw"] for r in rows]),
    )
