"""The answer set: questions as a person asks a voice assistant (as the STT writes them), with the key words a
right answer contains (any one of them is a hit). Scored by ``python -m s2s.bench answers``.

Mostly facts, plus two everyday requests whose right answer names a dish or a garment: the drift a small model
shows ("I'm sorry for your loss" to a dinner question) misses them.

A key word is matched as a whole word (or phrase) in the lower-cased reply, so "8" does not hit "18"; a reply that
names the key word to deny it ("not Paris") still counts: the set measures drift, not fine correctness.
"""
from __future__ import annotations

import re

QUESTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("What's the capital of France?", ("paris",)),
    ("How many legs does a spider have?", ("eight", "8")),
    ("Can you tell me who wrote Romeo and Juliet?", ("shakespeare",)),
    ("What's the biggest planet in our solar system?", ("jupiter",)),
    ("Hey, what color is the sky on a clear day?", ("blue",)),
    ("How many days are there in a week?", ("seven", "7")),
    ("What should I cook for dinner tonight?", ("pasta", "spaghetti", "lasagna", "noodles", "rice", "chicken",
                                                "fish", "salmon", "beef", "steak", "soup", "salad", "pizza",
                                                "tacos", "curry", "stir fry", "vegetables", "burger", "burgers",
                                                "sandwich", "sandwiches", "omelette", "eggs")),
    ("Do you know what the largest ocean is?", ("pacific",)),
    ("I'm feeling cold, what should I wear?", ("sweater", "jumper", "jacket", "coat", "layers", "scarf", "hat",
                                               "gloves", "hoodie", "fleece", "socks", "thermal")),
    ("Which animal is called the king of the jungle?", ("lion", "lions")),
    ("What's the capital of Japan?", ("tokyo",)),
    ("At what temperature does water freeze in Celsius?", ("zero", "0")),
    ("How many minutes are in an hour?", ("sixty", "60")),
    ("What language do people speak in Brazil?", ("portuguese",)),
    ("Who painted the Mona Lisa?", ("leonardo", "da vinci")),
    ("What's the tallest mountain in the world?", ("everest",)),
    ("What planet do we live on?", ("earth",)),
    ("What's two plus two?", ("four", "4")),
    ("What do you call a baby dog?", ("puppy", "puppies")),
    ("How many sides does a triangle have?", ("three", "3")),
]


def hit(reply: str, keys: tuple[str, ...]) -> bool:
    """Whether the reply contains one of ``keys`` as a whole word or phrase (case and punctuation ignored)."""
    text = " " + re.sub(r"[\W_]+", " ", reply.lower()) + " "
    return any(f" {key} " in text for key in keys)
