"""Labelled documents for fitting heads on a text pair: harder than :func:`tests.text_models.texts`.

In ``texts``' documents four of seven words name the topic, so both test models rank every
document of a topic first and the naive merge is already perfect (mAP 1.0): no fit can beat it.
:func:`mixed_texts` says its topic in two words and carries a stray word of another topic, as
real documents do. :func:`topic_sentences` are English sentences on six topics for the real
pretrained pair (MiniLM).
"""

from __future__ import annotations

import numpy as np

from tests.text_models import FILLER, TOPICS


def mixed_texts(count: int, *, seed: int = 0) -> tuple[list[str], list[str]]:
    """``count`` documents of the test vocabulary and their topics: two words of the topic, one
    of another topic and four fillers, shuffled."""
    rng = np.random.default_rng(seed)
    names = sorted(TOPICS)
    docs, labels = [], []
    for i in range(count):
        topic = names[i % len(names)]
        stray = names[(i + 1 + int(rng.integers(len(names) - 1))) % len(names)]
        words = [*rng.choice(TOPICS[topic], size=2), rng.choice(TOPICS[stray]), *rng.choice(FILLER, size=4)]
        rng.shuffle(words)
        docs.append(" ".join(words))
        labels.append(topic)
    return docs, labels


SUBJECTS = {
    "cooking": [
        "a slow-cooked tomato sauce",
        "the sourdough starter",
        "roasting vegetables",
        "a lemon tart",
        "homemade pasta",
        "the spice rack",
        "a cast iron pan",
        "braised short ribs",
        "fresh herbs",
        "a mushroom risotto",
        "the bread dough",
        "grilled salmon",
    ],
    "football": [
        "the striker's late goal",
        "the penalty shootout",
        "the league table",
        "the new goalkeeper",
        "a red card in the final minutes",
        "the transfer window",
        "the coach's tactics",
        "the derby match",
        "an offside decision",
        "the championship title",
        "the midfield press",
        "a corner kick",
    ],
    "finance": [
        "the interest rate decision",
        "quarterly earnings",
        "the bond market",
        "a stock buyback",
        "inflation figures",
        "the pension fund",
        "currency exchange rates",
        "the mortgage payments",
        "a venture capital round",
        "the central bank",
        "dividend yields",
        "the household budget",
    ],
    "weather": [
        "the heavy rain",
        "a cold front",
        "the summer heatwave",
        "morning fog",
        "the thunderstorm warning",
        "snow on the mountain roads",
        "strong coastal winds",
        "the humidity",
        "a sudden hailstorm",
        "the weekly forecast",
        "frost on the fields",
        "the drought",
    ],
    "medicine": [
        "the flu vaccine",
        "a knee operation",
        "the blood pressure readings",
        "the new antibiotic",
        "physical therapy",
        "the clinical trial",
        "a migraine",
        "the emergency room",
        "the dentist visit",
        "an allergy test",
        "the recovery after surgery",
        "a vitamin deficiency",
    ],
    "computing": [
        "the database migration",
        "a memory leak",
        "the new laptop",
        "the compiler error",
        "cloud storage costs",
        "a software update",
        "the network outage",
        "the password manager",
        "a slow web page",
        "the graphics card",
        "unit tests",
        "the operating system",
    ],
}
TEMPLATES = [
    "{s} was all anyone talked about today.",
    "I read a long article about {s}.",
    "My neighbour keeps asking me about {s}.",
    "Yesterday we finally dealt with {s}.",
    "Nobody expected {s} to matter this much.",
    "There is a short report on {s} in the paper.",
    "{s}, again, and nothing else this week.",
    "She wrote to the group about {s} and what to do next.",
    "We spent the afternoon arguing about {s}.",
    "Is {s} really as important as they say?",
]


def topic_sentences(count: int, *, seed: int = 0) -> tuple[list[str], list[str]]:
    """``count`` English sentences on six topics and their topics: a subject of the topic in one
    of ten templates the topics share (half the sentence says nothing of its topic)."""
    rng = np.random.default_rng(seed)
    names = sorted(SUBJECTS)
    docs, labels = [], []
    for i in range(count):
        topic = names[i % len(names)]
        subject = str(rng.choice(SUBJECTS[topic]))
        text = str(rng.choice(TEMPLATES)).format(s=subject)
        docs.append(text[0].upper() + text[1:])
        labels.append(topic)
    return docs, labels
