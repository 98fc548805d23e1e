"""Regenerate ``tiny_stories.txt``: the small training corpus shipped with liger_core (demo and tests).

Synthetic English written by a small grammar (so it is ours to ship, with no download and no licence
question): short village stories that reuse their characters, arithmetic facts, weather reports, recipes and
short dialogues. It is deliberately learnable by a tiny model in a few dozen steps (the loss falls quickly at
first, then slowly), which is what a loss-curve comparison needs. Deterministic: the same seed gives the same
bytes. Usage: ``python liger_core/data/generate_corpus.py`` (writes next to this file).
"""

from __future__ import annotations

import random
from pathlib import Path

NAMES = ["Mara", "Tobin", "Ilse", "Oren", "Pia", "Jory", "Wren", "Caleb", "Nell", "Arlo", "Sefa", "Hugo"]
ANIMALS = ["fox", "goat", "heron", "badger", "hen", "otter", "crow", "mule", "hare", "owl"]
PLACES = [
    "the mill",
    "the orchard",
    "the river",
    "the market",
    "the old bridge",
    "the forge",
    "the hill",
    "the inn",
]
OBJECTS = ["a basket", "a lantern", "a rope", "a kettle", "a map", "a fiddle", "a loaf", "a key", "a ladder"]
ADJECTIVES = [
    "small",
    "quiet",
    "clever",
    "tired",
    "brave",
    "hungry",
    "cheerful",
    "careful",
    "sleepy",
    "curious",
]
WEATHER = ["rain", "fog", "snow", "wind", "sunshine", "hail", "thunder", "frost"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty"
).split()
FOODS = ["flour", "butter", "apples", "honey", "salt", "milk", "oats", "pears", "eggs", "cheese"]
VERBS_PAST = ["found", "carried", "mended", "lost", "painted", "sold", "borrowed", "hid", "cleaned", "shared"]
MOVES = ["walked", "ran", "hurried", "wandered", "climbed", "rode"]


def story(rng: random.Random) -> str:
    hero, friend = rng.sample(NAMES, 2)
    animal, place, place2 = rng.choice(ANIMALS), *rng.sample(PLACES, 2)
    obj, adj = rng.choice(OBJECTS), rng.choice(ADJECTIVES)
    day = rng.choice(DAYS)
    lines = [
        f"On {day}, {hero} {rng.choice(MOVES)} to {place} with {obj}.",
        f"There {hero} met a {adj} {animal} that could not find its way home.",
        f'"Where do you live?" asked {hero}. "Near {place2}," said the {animal}.',
        f"So {hero} and the {animal} {rng.choice(MOVES)} to {place2} together.",
    ]
    if rng.random() < 0.6:
        lines.append(
            f"On the way they met {friend}, who {rng.choice(VERBS_PAST)} {rng.choice(OBJECTS)} for them."
        )
    lines.append(f"When they reached {place2}, the {animal} was happy, and {hero} went home before dark.")
    if rng.random() < 0.5:
        lines.append(f"The next day {hero} told {friend} the whole story, and {friend} laughed.")
    return " ".join(lines)


def arithmetic(rng: random.Random) -> str:
    facts = []
    for _ in range(rng.randint(3, 6)):
        a, b = rng.randint(0, 10), rng.randint(0, 10)
        if rng.random() < 0.5:
            facts.append(f"{NUMBERS[a]} plus {NUMBERS[b]} is {NUMBERS[a + b]}.")
        else:
            a, b = max(a, b), min(a, b)
            facts.append(f"{NUMBERS[a]} minus {NUMBERS[b]} is {NUMBERS[a - b]}.")
    return " ".join(facts)


def weather(rng: random.Random) -> str:
    day = rng.randrange(len(DAYS))
    parts = []
    for i in range(rng.randint(2, 4)):
        parts.append(
            f"On {DAYS[(day + i) % 7]} there will be {rng.choice(WEATHER)} over {rng.choice(PLACES)}."
        )
    return "Weather report. " + " ".join(parts)


def recipe(rng: random.Random) -> str:
    foods = rng.sample(FOODS, rng.randint(2, 4))
    cups = [rng.randint(1, 6) for _ in foods]
    steps = [f"Take {NUMBERS[n]} cup{'s' if n > 1 else ''} of {food}." for n, food in zip(cups, foods)]
    steps.append(f"Mix them well and bake for {NUMBERS[rng.randint(10, 20)]} minutes.")
    return f"A recipe from {rng.choice(PLACES)}: " + " ".join(steps)


def dialogue(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    thing = rng.choice(OBJECTS)
    return (
        f'{a}: "Have you seen {thing}?" {b}: "Yes, it is at {rng.choice(PLACES)}." '
        f'{a}: "Thank you, {b}." {b}: "You are welcome, {a}."'
    )


def generate(target_bytes: int = 300_000, seed: int = 1234) -> str:
    rng = random.Random(seed)
    kinds = [story] * 5 + [arithmetic, weather, recipe, dialogue, dialogue]
    paragraphs, size = [], 0
    while size < target_bytes:
        p = rng.choice(kinds)(rng)
        paragraphs.append(p)
        size += len(p) + 2
    return "\n\n".join(paragraphs) + "\n"


if __name__ == "__main__":
    out = Path(__file__).with_name("tiny_stories.txt")
    out.write_text(generate(), encoding="ascii")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
