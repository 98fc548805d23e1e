"""An ordinary HF training script for a Qwen2-VL-style vision-language model (nothing liger-specific in it):
the activation tests run it unchanged.

    python train_vlm.py --model_dir DIR --output_dir OUT [TrainingArguments flags ...]

The training rows are random images with random captions, built in the layout Qwen2VLProcessor returns
(`pixel_values`, `image_grid_thw`, and `input_ids` with one image token per merged patch group), from the
model's config alone (token ids, patch and merge sizes), so no processor files are needed.
Writes OUT/result.json: the parsed flag, the step losses and the liger_core kinds in the model.
"""

import json
import os
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForImageTextToText, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ScriptArguments:
    model_dir: str = field(metadata={"help": "directory with the model"})
    image_seed: int = 1


# (height, width, caption tokens); height and width in units of patch_size * spatial_merge_size
IMAGES = [(2, 2, 5), (2, 3, 3), (3, 2, 6), (2, 2, 2)]


def image_patches(image, patch, temporal, merge):
    """`pixel_values` and `image_grid_thw` of one still image (channels, height, width) as
    Qwen2VLImageProcessor lays them out: the frame repeated over the temporal patch, each group of
    merge x merge patches contiguous, each patch flattened as (channel, time, row, column)."""
    channels, height, width = image.shape
    rows, cols = height // patch, width // patch
    frames = image.unsqueeze(0).expand(temporal, channels, height, width)
    x = frames.reshape(temporal, channels, rows // merge, merge, patch, cols // merge, merge, patch)
    x = x.permute(2, 5, 3, 6, 1, 0, 4, 7)
    return x.reshape(rows * cols, channels * temporal * patch * patch), torch.tensor([1, rows, cols])


def build_rows(config, seed):
    vision, text = config.vision_config, config.text_config
    patch, temporal, merge = vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size
    special = {config.image_token_id, config.vision_start_token_id, config.vision_end_token_id}
    special |= {config.video_token_id, text.pad_token_id, text.eos_token_id, text.bos_token_id}
    words = torch.tensor([i for i in range(text.vocab_size) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for h, w, n_text in IMAGES:
        side = patch * merge
        image = torch.rand(vision.in_channels, h * side, w * side, generator=generator)
        pixel_values, grid_thw = image_patches(image, patch, temporal, merge)
        n_image = int(grid_thw.prod()) // (merge * merge)
        caption = words[torch.randint(len(words), (n_text,), generator=generator)].tolist()
        input_ids = (
            [config.vision_start_token_id]
            + [config.image_token_id] * n_image
            + [config.vision_end_token_id]
            + caption
            + [text.eos_token_id]
        )
        rows.append({"input_ids": input_ids, "pixel_values": pixel_values, "image_grid_thw": grid_thw})
    return rows


def make_collator(config):
    pad = config.text_config.pad_token_id
    not_caption = [config.image_token_id, config.vision_start_token_id, config.vision_end_token_id]

    def collate(rows):
        length = max(len(r["input_ids"]) for r in rows)
        input_ids = torch.full((len(rows), length), pad)
        attention_mask = torch.zeros_like(input_ids)
        for i, r in enumerate(rows):
            input_ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            attention_mask[i, : len(r["input_ids"])] = 1
        ignored = (attention_mask == 0) | torch.isin(input_ids, torch.tensor(not_caption))
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": input_ids.masked_fill(ignored, -100),
            "pixel_values": torch.cat([r["pixel_values"] for r in rows]),
            "image_grid_thw": torch.stack([r["image_grid_thw"] for r in rows]),
        }

    return collate


def main():
    script_args, training_args = HfArgumentParser(
        (ScriptArguments, TrainingArguments)
    ).parse_args_into_dataclasses()
    model = AutoModelForImageTextToText.from_pretrained(script_args.model_dir, dtype=torch.float32)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=build_rows(model.config, script_args.image_seed),
        data_collator=make_collator(model.config),
    )
    trainer.train()
    result = {
        "use_liger_kernel": training_args.use_liger_kernel,
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "kinds": sorted(
            {m.__dict__["_liger_core_kind"] for m in model.modules() if "_liger_core_kind" in m.__dict__}
        ),
    }
    with open(os.path.join(training_args.output_dir, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
