"""benchmarks/learning.py's task: short questions with one right answer (capitals, colours, opposites, plurals), the
system prompts, and the strict reward that format alone or a list of candidates cannot game."""

from __future__ import annotations

import random
import re
import unicodedata
from dataclasses import dataclass

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "Japan": "Tokyo", "China": "Beijing", "Russia": "Moscow", "the United Kingdom": "London", "Egypt": "Cairo",
    "Greece": "Athens", "Ireland": "Dublin", "Austria": "Vienna", "Hungary": "Budapest", "Poland": "Warsaw",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen",
    "the Netherlands": "Amsterdam", "Belgium": "Brussels", "the Czech Republic": "Prague", "Turkey": "Ankara",
    "Iran": "Tehran", "Iraq": "Baghdad", "India": "New Delhi", "Thailand": "Bangkok", "Vietnam": "Hanoi",
    "South Korea": "Seoul", "Indonesia": "Jakarta", "the Philippines": "Manila", "Australia": "Canberra",
    "Canada": "Ottawa", "Argentina": "Buenos Aires", "Peru": "Lima", "Chile": "Santiago", "Colombia": "Bogota",
    "Venezuela": "Caracas", "Cuba": "Havana", "Kenya": "Nairobi", "Nigeria": "Abuja", "Ethiopia": "Addis Ababa",
    "Morocco": "Rabat", "Saudi Arabia": "Riyadh", "Afghanistan": "Kabul", "Pakistan": "Islamabad",
    "Bangladesh": "Dhaka", "Nepal": "Kathmandu", "Switzerland": "Bern", "Romania": "Bucharest",
    "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb", "Ukraine": "Kyiv", "Syria": "Damascus",
    "Lebanon": "Beirut", "Jordan": "Amman", "Scotland": "Edinburgh", "Wales": "Cardiff", "Iceland": "Reykjavik",
    "New Zealand": "Wellington", "Ghana": "Accra", "Senegal": "Dakar", "Libya": "Tripoli", "Brazil": "Brasilia",
    "Estonia": "Tallinn", "Latvia": "Riga", "Lithuania": "Vilnius", "Qatar": "Doha", "Malaysia": "Kuala Lumpur",
    "Uganda": "Kampala", "Zimbabwe": "Harare", "Jamaica": "Kingston", "Slovakia": "Bratislava",
    "Slovenia": "Ljubljana", "Albania": "Tirana", "Cambodia": "Phnom Penh", "Mongolia": "Ulaanbaatar",
}  # fmt: skip
COLOURS = {
    "the sky on a clear day": "blue", "grass": "green", "a ripe banana": "yellow", "fresh snow": "white",
    "coal": "black", "blood": "red", "a ripe strawberry": "red", "a lemon": "yellow", "a carrot": "orange",
    "a ripe tomato": "red", "milk": "white", "a ripe cherry": "red", "an emerald": "green", "a sapphire": "blue",
    "chocolate": "brown", "a pumpkin": "orange", "a lime": "green", "a crow": "black", "a polar bear": "white",
    "a flamingo": "pink", "a cloud on a sunny day": "white", "the sun in a child's drawing": "yellow",
    "a summer leaf": "green", "an eggplant": "purple", "lavender": "purple", "charcoal": "black", "a ruby": "red",
    "broccoli": "green", "a cucumber": "green", "coffee": "brown", "a fire truck": "red", "a school bus": "yellow",
    "cotton": "white", "soot": "black", "a canary": "yellow", "a pig": "pink", "mustard": "yellow",
    "a tangerine": "orange", "a raven": "black", "a swan": "white", "a dandelion": "yellow", "a pine tree": "green",
    "a plum": "purple", "spinach": "green", "a panther": "black", "mud": "brown", "an elephant": "grey",
    "the ocean": "blue", "a frog": "green", "tree bark": "brown", "an amethyst": "purple", "a blueberry": "blue",
}  # fmt: skip
COLOUR_WORDS = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white", "grey",
                "violet", "indigo", "gold", "silver", "beige", "tan", "cream"]  # fmt: skip
OPPOSITES = {
    "hot": "cold", "cold": "hot", "day": "night", "night": "day", "fast": "slow",
    "slow": "fast", "happy": "sad", "sad": "happy", "dark": "light", "tall": "short", "young": "old",
    "open": "closed", "wet": "dry", "dry": "wet", "soft": "hard", "early": "late", "late": "early",
    "full": "empty", "empty": "full", "rich": "poor", "poor": "rich", "strong": "weak", "weak": "strong",
    "thick": "thin", "thin": "thick", "loud": "quiet", "quiet": "loud", "push": "pull", "pull": "push",
    "win": "lose", "lose": "win", "true": "false", "false": "true", "buy": "sell", "sell": "buy",
    "love": "hate", "hate": "love", "big": "small", "small": "big", "above": "below", "below": "above",
    "inside": "outside", "outside": "inside", "north": "south", "south": "north", "east": "west",
    "west": "east", "always": "never", "never": "always", "clean": "dirty", "dirty": "clean", "high": "low",
    "low": "high", "near": "far", "far": "near", "begin": "end", "friend": "enemy", "asleep": "awake",
    "awake": "asleep", "alive": "dead", "dead": "alive", "cheap": "expensive", "expensive": "cheap",
    "sweet": "sour", "summer": "winter", "winter": "summer", "boy": "girl", "girl": "boy", "king": "queen",
    "queen": "king", "enter": "exit", "heavy": "light", "wide": "narrow", "narrow": "wide",
}  # fmt: skip
PLURALS = {
    "mouse": "mice", "child": "children", "foot": "feet", "tooth": "teeth", "man": "men", "woman": "women",
    "goose": "geese", "person": "people", "ox": "oxen", "leaf": "leaves", "knife": "knives", "wife": "wives",
    "wolf": "wolves", "half": "halves", "life": "lives", "loaf": "loaves", "shelf": "shelves", "thief": "thieves",
    "calf": "calves", "potato": "potatoes", "tomato": "tomatoes", "hero": "heroes", "box": "boxes", "fox": "foxes",
    "bus": "buses", "church": "churches", "dish": "dishes", "watch": "watches", "baby": "babies", "city": "cities",
    "party": "parties", "story": "stories", "lady": "ladies", "puppy": "puppies", "cherry": "cherries",
    "berry": "berries", "family": "families", "country": "countries", "day": "days", "boy": "boys", "key": "keys",
    "toy": "toys", "cat": "cats", "dog": "dogs", "book": "books", "car": "cars", "tree": "trees", "house": "houses",
    "apple": "apples", "bird": "birds", "chair": "chairs", "table": "tables", "girl": "girls", "horse": "horses",
    "glass": "glasses", "kiss": "kisses", "class": "classes", "brush": "brushes", "match": "matches",
    "louse": "lice", "die": "dice", "penny": "pennies", "cookie": "cookies", "monkey": "monkeys", "video": "videos",
    "photo": "photos", "piano": "pianos", "pencil": "pencils", "flower": "flowers", "star": "stars",
}  # fmt: skip
# Other spellings and accepted synonyms of an answer; each counts as the same candidate.
ALIASES = {"kyiv": ["kiev"], "bern": ["berne"], "closed": ["shut"], "big": ["large"], "small": ["little"],
           "sour": ["bitter"], "end": ["finish"], "grey": ["gray"]}  # fmt: skip

RULE = "Answer the question with one short sentence. Put the answer in square brackets. Give exactly one answer.\n"
# Worked examples use items outside the data set. The model copies an example's sentence only for questions of
# the same shape, so `per-kind` gives one example per kind of question.
SYSTEM_PROMPTS = {
    "one-example": RULE + "Example:\nQuestion: What is the opposite of up?\nAnswer: The opposite of up is [down].",
    "per-kind": RULE
    + "Examples:\nQuestion: What is the capital of Mexico?\nAnswer: The capital of Mexico is [Mexico City].\n"
    "Question: What is the opposite of up?\nAnswer: The opposite of up is [down].\n"
    "Question: What is the plural of bench?\nAnswer: The plural of bench is [benches].",
}
BRACKET = re.compile(r"\[([^\[\]]*)\]")


def normalize(text: str) -> str:
    """Lower-case ASCII words without punctuation or a leading article: how answers are compared."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    text = " ".join(re.sub(r"[^a-z0-9 ]+", " ", text).split())
    return re.sub(r"^(the|a|an) ", "", text)


@dataclass(frozen=True)
class Item:
    kind: str
    question: str
    answer: str

    def accepted(self) -> set[str]:
        answer = normalize(self.answer)
        return {answer, *ALIASES.get(answer, [])}


def _vocabulary(kind: str) -> list[str]:
    """Every answer of this kind of question: naming any of them counts as giving a candidate."""
    if kind == "capital":
        words = [normalize(c) for c in CAPITALS.values()]
    elif kind == "colour":
        words = list(COLOUR_WORDS)
    elif kind == "plural":
        words = list(PLURALS.values())
    else:
        words = [normalize(w) for pair in OPPOSITES.items() for w in pair]
    return sorted({*words, *(alias for w in words for alias in ALIASES.get(w, []))})


def build_items(kinds: list[str] | None = None) -> list[Item]:
    items = [Item("capital", f"What is the capital of {c}?", a) for c, a in CAPITALS.items()]
    items += [Item("colour", f"What color is {thing}?", a) for thing, a in COLOURS.items()]
    items += [Item("opposite", f"What is the opposite of {w}?", a) for w, a in OPPOSITES.items()]
    items += [Item("plural", f"What is the plural of {w}?", a) for w, a in PLURALS.items()]
    return [i for i in items if kinds is None or i.kind in kinds]


def split(items: list[Item], heldout_fraction: float = 1 / 3, seed: int = 0) -> tuple[list[Item], list[Item]]:
    """A fixed split, stratified by kind: (train, held-out). The held-out items are never trained on."""
    rng = random.Random(seed)
    train, heldout = [], []
    for kind in sorted({i.kind for i in items}):
        group = sorted((i for i in items if i.kind == kind), key=lambda i: i.question)
        rng.shuffle(group)
        cut = round(len(group) * heldout_fraction)
        heldout += group[:cut]
        train += group[cut:]
    return train, heldout


def _named(item: Item, text: str) -> set[str]:
    """Known answers of the item's kind that `text` names, leaving out words of the question itself."""
    plain, question = normalize(text), normalize(item.question)
    return {
        w
        for w in _vocabulary(item.kind)
        if re.search(rf"\b{re.escape(w)}\b", plain) and not re.search(rf"\b{re.escape(w)}\b", question)
    }


def candidates(item: Item, text: str) -> set[str]:
    """The distinct answers a reply gives: known answers it names, plus any bracket content naming none."""
    found = _named(item, text)
    for content in BRACKET.findall(text):
        if normalize(content) and not _named(item, content):
            found.add(normalize(content))
    canonical = normalize(item.answer)
    return {canonical if f in item.accepted() else f for f in found}


@dataclass(frozen=True)
class Score:
    reward: float
    format_ok: bool  # exactly one bracket holding one to three words
    correct: bool  # the right answer is the only candidate given


def score(item: Item, text: str, partial_credit: float = 0.0) -> Score:
    """The strict compound reward (see the module docstring) and its two parts."""
    brackets = BRACKET.findall(text)
    format_ok = len(brackets) == 1 and 0 < len(normalize(brackets[0]).split()) <= 3
    correct = candidates(item, text) == {normalize(item.answer)}
    if correct and format_ok and normalize(brackets[0]) in item.accepted():
        return Score(1.0, format_ok, correct)
    return Score(partial_credit if correct else 0.0, format_ok, correct)
