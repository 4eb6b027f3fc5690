"""The built-in decision suite's generator: seven benchmark-like families of templated decisions, no network.

Families: intent routing, NLI, number comparison, tool choice, yes/no facts, sentiment, and multi-question
requests (choice and boolean together). Each draws from a small closed world (intents, tools, a table of items
and their kinds, people and places), so a tiny model can learn it in a minute or two on a CPU and a quantized
variant has real answers to keep or lose. `generate(split, n, seed)` is deterministic (seeded `random.Random`);
train and eval never share a request: each request's canonical text belongs to exactly one split by its hash,
and each split draws from its own seed. Gold answers are balanced per question. `python -m quantbench.suitegen`
rewrites the built-in eval suite bit-identically.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantbench.protocol import SuiteRecord

GENERATOR_VERSION = 1
DEFAULT_SUITE_PATH = Path(__file__).parent / "data" / "default_suite.jsonl"
DEFAULT_EVAL_SIZE = 364  # 52 records per family
EVAL_SHARE = 4  # one request text in EVAL_SHARE belongs to the eval split

Draft = tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, str]]  # state, questions, gold

# -- the closed world ----------------------------------------------------------------------------------------
CITIES = ["Paris", "Tokyo", "Berlin", "Lima", "Cairo", "Oslo", "Madrid", "Denver", "Seoul", "Dublin"]
DAYS = ["today", "tomorrow", "on Monday", "on Friday", "this weekend", "next week"]
TIMES = ["6 am", "7 am", "8 am", "noon", "5 pm", "9 pm"]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jon", "Kai", "Lea"]
FOODS = ["pizza", "burger", "salad", "sushi", "noodles", "taco"]
GENRES = ["jazz", "rock", "pop", "classical", "folk", "techno"]
TOPICS = ["the budget", "the launch", "solar panels", "the election", "rare coins", "the new phone"]
LANGUAGES = ["French", "Spanish", "German", "Japanese", "Italian"]
PLACES = ["kitchen", "garden", "garage", "library", "office", "park", "station", "market"]
MOODS = ["happy", "tired", "hungry", "sleepy", "angry", "calm"]
ACCOUNTS = ["checking", "savings", "joint", "business", "travel"]
CODE = ["python", "rust", "java", "bash", "go"]
PRODUCTS = ["lamp", "kettle", "jacket", "phone case", "backpack", "blender", "chair", "headset"]

INTENTS = {
    "book_flight": "Book a plane ticket",
    "check_weather": "Tell the weather forecast",
    "play_music": "Play music",
    "set_alarm": "Set an alarm",
    "order_food": "Order food for delivery",
    "book_table": "Reserve a table at a restaurant",
    "transfer_money": "Send money to someone",
    "check_balance": "Show the account balance",
}
INTENT_TEMPLATES = {
    "book_flight": [
        "I need a flight to {city} {day}",
        "book me a plane ticket to {city}",
        "can you get me on a flight from {city} to {city2}",
        "find flights to {city} {day}",
    ],
    "check_weather": [
        "what is the weather in {city} {day}",
        "will it rain in {city} {day}",
        "is it going to be cold in {city}",
        "show me the forecast for {city}",
    ],
    "play_music": [
        "play some {genre} music",
        "I want to hear {genre}",
        "put on my {genre} playlist",
        "start a {genre} song",
    ],
    "set_alarm": [
        "wake me up at {time}",
        "set an alarm for {time} {day}",
        "I need an alarm at {time}",
        "alarm at {time} please",
    ],
    "order_food": [
        "order a {food} for delivery",
        "I am hungry, get me a {food}",
        "deliver a {food} to my place",
        "can I get a {food} delivered {day}",
    ],
    "book_table": [
        "reserve a table for {n} at {time}",
        "book a table for {n} people {day}",
        "get us a table at the restaurant at {time}",
        "I want a dinner reservation for {n}",
    ],
    "transfer_money": [
        "send {amount} dollars to {name}",
        "transfer {amount} to {name}",
        "pay {name} {amount} dollars",
        "move {amount} dollars into the account of {name}",
    ],
    "check_balance": [
        "how much money is in my {account} account",
        "what is my {account} balance {day}",
        "show the balance of my {account} account",
        "do I have enough money in my {account} account",
    ],
}
URGENT = ["right now", "asap", "immediately", "urgently"]
NOT_URGENT = ["when you can", "no rush", "sometime"]
POLITE = ["please", "thanks", "thank you"]
OPENERS = ["", "", "hey, ", "ok so ", "hi, ", "could you help: ", "quick one: "]

TOOLS = {
    "calculator": "Do arithmetic",
    "web_search": "Search the web",
    "calendar": "Read or change the calendar",
    "email": "Write and send email",
    "translator": "Translate between languages",
    "code_runner": "Run program code",
    "maps": "Find routes and places",
}
TOOL_TEMPLATES = {
    "calculator": ["what is {a} times {b}", "add {a} and {b}", "compute {a} divided by {b}", "how much is {a} plus {b}"],
    "web_search": [
        "look up the latest news about {topic}",
        "search online for {topic}",
        "find articles about {topic}",
        "who wrote about {topic} last year",
    ],
    "calendar": [
        "schedule a meeting with {name} {day}",
        "what is on my agenda {day}",
        "move my appointment with {name} to {time}",
        "block {time} {day} for a call",
    ],
    "email": [
        "send an email to {name} about {topic}",
        "write a message to {name} saying I am late",
        "reply to the mail from {name}",
        "forward the report to {name} by mail",
    ],
    "translator": [
        "translate good morning into {language}",
        "how do you say thank you in {language}",
        "what does this {language} sentence mean",
        "put this paragraph into {language}",
    ],
    "code_runner": [
        "run this {code} script",
        "execute the {code} unit tests",
        "run my {code} program and show the output",
        "execute this snippet of {code} code",
    ],
    "maps": [
        "how do I get to the {place} from here",
        "directions to {city}",
        "how far is {city} from {city2}",
        "find the nearest {place}",
    ],
}

# The closed world of the facts family: item -> category; fruit and vegetables are the edible things.
# Each question is answered from the item alone (a memorised fact). Questions that compare two things the model
# must recall ("is the banana red?") are pure interactions that a 2-layer model does not learn in minutes.
ITEMS = {
    "banana": "fruit", "cherry": "fruit", "lime": "fruit", "coconut": "fruit", "mango": "fruit",
    "carrot": "vegetable", "potato": "vegetable", "onion": "vegetable", "cabbage": "vegetable", "leek": "vegetable",
    "canary": "animal", "frog": "animal", "swan": "animal", "badger": "animal", "otter": "animal",
    "taxi": "vehicle", "tractor": "vehicle", "ambulance": "vehicle", "scooter": "vehicle", "tram": "vehicle",
    "hammer": "tool", "wrench": "tool", "shovel": "tool", "chisel": "tool", "ladder": "tool",
}
CATEGORIES = {"fruit": "A fruit", "vegetable": "A vegetable", "animal": "An animal", "vehicle": "A vehicle", "tool": "A tool"}
EDIBLE = ("fruit", "vegetable")
EDIBLE_ASKS = ["Can you eat a {item}?", "Is a {item} food?", "Is the {item} something people eat?",
               "Could a {item} be part of a meal?", "Is it safe to eat the {item}?"]
CATEGORY_ASKS = ["What kind of thing is it?", "Which group does the item belong to?", "What is a {item}?"]


def world_facts() -> list[str]:
    """The closed world's facts as true sentences (the fixture also reads them as plain text)."""
    out = []
    for item, category in ITEMS.items():
        eat = "People eat" if category in EDIBLE else "Nobody eats"
        out += [f"A {item} is a kind of {category}.", f"{eat} a {item}."]
    return out


POSITIVE = ["great", "excellent", "wonderful", "fantastic", "lovely", "perfect", "superb"]
NEGATIVE = ["terrible", "awful", "broken", "disappointing", "horrible", "useless", "flimsy"]
NEUTRAL = ["okay", "fine", "average", "ordinary", "acceptable"]


def _choice(criteria: dict[str, str], description: str | None = None) -> dict[str, Any]:
    q: dict[str, Any] = {"type": "choice", "criteria": dict(criteria)}
    if description:
        q["description"] = description
    return q


def _boolean(description: str | None = None) -> dict[str, Any]:
    return {"type": "boolean", "description": description} if description else {"type": "boolean"}


def _fill(rng: random.Random, template: str) -> str:
    city, city2 = rng.sample(CITIES, 2)
    return template.format(
        city=city, city2=city2, day=rng.choice(DAYS), time=rng.choice(TIMES), name=rng.choice(NAMES),
        food=rng.choice(FOODS), genre=rng.choice(GENRES), topic=rng.choice(TOPICS), language=rng.choice(LANGUAGES),
        place=rng.choice(PLACES), n=rng.randint(2, 9), amount=rng.choice([20, 50, 75, 100, 250, 500]),
        a=rng.randint(2, 99), b=rng.randint(2, 99), account=rng.choice(ACCOUNTS), code=rng.choice(CODE),
    )


def _utterance(rng: random.Random, intent: str) -> str:
    return rng.choice(OPENERS) + _fill(rng, rng.choice(INTENT_TEMPLATES[intent]))


# -- the families: each returns one draft (state, questions, gold) --------------------------------------------
def intent(rng: random.Random) -> Draft:
    name = rng.choice(list(INTENTS))
    return {"utterance": _utterance(rng, name)}, {"intent": _choice(INTENTS)}, {"intent": name}


def nli(rng: random.Random) -> Draft:
    person, other = rng.sample(NAMES, 2)
    place, place2 = rng.sample(PLACES, 2)
    premise = rng.choice([f"{person} is in the {place}.", f"{person} went to the {place} and stayed there."])
    label = rng.choice(["entailment", "neutral", "contradiction"])
    if label == "entailment":
        hypothesis = rng.choice([f"{person} is in the {place}.", f"The {place} is where {person} is."])
    elif label == "contradiction":
        hypothesis = rng.choice([f"{person} is not in the {place}.", f"{person} is in the {place2}."])
    else:
        hypothesis = rng.choice([f"{person} is {rng.choice(MOODS)}.", f"{other} is {rng.choice(MOODS)}."])
    criteria = {
        "entailment": "The hypothesis must be true",
        "neutral": "The hypothesis may or may not be true",
        "contradiction": "The hypothesis must be false",
    }
    return {"premise": premise, "hypothesis": hypothesis}, {"label": _choice(criteria)}, {"label": label}


def compare(rng: random.Random) -> Draft:
    a, b = rng.sample(range(10, 100), 2)
    state = {"a": a, "b": b}
    if rng.random() < 0.5:
        criteria = {"a": "a is the larger number", "b": "b is the larger number"}
        return state, {"larger": _choice(criteria, "Which number is larger?")}, {"larger": "a" if a > b else "b"}
    return state, {"a_is_larger": _boolean("Is a larger than b?")}, {"a_is_larger": "yes" if a > b else "no"}


def tool(rng: random.Random) -> Draft:
    name = rng.choice(list(TOOLS))
    return {"task": rng.choice(OPENERS) + _fill(rng, rng.choice(TOOL_TEMPLATES[name]))}, {"tool": _choice(TOOLS)}, {"tool": name}


def facts(rng: random.Random) -> Draft:
    item = rng.choice(list(ITEMS))
    category = ITEMS[item]
    context = rng.choice([{}, {"speaker": rng.choice(NAMES)}, {"seen_in": rng.choice(PLACES)}])
    edible = "yes" if category in EDIBLE else "no"
    form = rng.random()
    if form < 0.45:
        text = rng.choice(EDIBLE_ASKS).format(item=item)
        return {**context, "item": item}, {"edible": _boolean(text)}, {"edible": edible}
    if form < 0.65:
        return {**context, "claim": f"People eat {item}s."}, {"claim_true": _boolean()}, {"claim_true": edible}
    text = rng.choice(CATEGORY_ASKS).format(item=item)
    return {**context, "item": item}, {"category": _choice(CATEGORIES, text)}, {"category": category}


def sentiment(rng: random.Random) -> Draft:
    product = rng.choice(PRODUCTS)
    label = rng.choice(["positive", "negative", "neutral"])
    if label == "positive":
        words = f"was {rng.choice(POSITIVE)}"
    elif label == "negative":
        words = rng.choice([f"was {rng.choice(NEGATIVE)}", f"was not {rng.choice(POSITIVE)}"])
    else:
        words = f"was {rng.choice(NEUTRAL)}"
    opener = rng.choice(["The", "My new", "This", "Our"])
    tail = rng.choice(["", f" I bought it {rng.choice(DAYS)}.", " It came in a box."])
    review = f"{opener} {product} {words}.{tail}"
    criteria = {"positive": "The reviewer liked it", "negative": "The reviewer disliked it", "neutral": "Neither"}
    return {"review": review}, {"sentiment": _choice(criteria)}, {"sentiment": label}


def multi(rng: random.Random) -> Draft:
    name = rng.choice(list(INTENTS))
    urgent = rng.random() < 0.5
    polite = rng.random() < 0.5
    words = _utterance(rng, name).removesuffix(" please")
    words += " " + rng.choice(URGENT if urgent else NOT_URGENT)
    if polite:
        words = f"{words}, {rng.choice(POLITE)}"
    questions: dict[str, dict[str, Any]] = {
        "intent": _choice(INTENTS),
        "urgent": _boolean("Does the user need it done immediately?"),
    }
    gold = {"intent": name, "urgent": "yes" if urgent else "no"}
    if rng.random() < 0.5:
        questions["polite"] = _boolean("Did the user say please or thanks?")
        gold["polite"] = "yes" if polite else "no"
    order = list(questions)
    rng.shuffle(order)  # each question is rendered alone, so order must not matter; vary it anyway
    return {"utterance": words}, {q: questions[q] for q in order}, gold


FAMILIES: dict[str, Callable[[random.Random], Draft]] = {
    "intent": intent,
    "nli": nli,
    "compare": compare,
    "tool": tool,
    "facts": facts,
    "sentiment": sentiment,
    "multi": multi,
}


# -- splitting and assembling ---------------------------------------------------------------------------------
def request_text(request: dict[str, Any]) -> str:
    """The canonical text of a request: what 'identical request' means for the train/eval split."""
    return json.dumps({"state": request["state"], "questions": request["questions"]}, sort_keys=True)


def split_of(request: dict[str, Any]) -> str:
    digest = hashlib.sha256(request_text(request).encode()).digest()
    return "eval" if digest[0] % EVAL_SHARE == 0 else "train"


def generate(split: str, n: int, seed: int = 0, *, families: dict[str, int] | None = None) -> list[SuiteRecord]:
    """n records of `split` ("eval" | "train"), families interleaved round-robin, every record with gold.
    `families` (family -> count) replaces the even split of n (the fixture trains more on harder families)."""
    if split not in ("eval", "train"):
        raise ValueError(f"split must be 'eval' or 'train', not {split!r}")
    per_family = families or {name: n // len(FAMILIES) + (i < n % len(FAMILIES)) for i, name in enumerate(FAMILIES)}
    unknown = set(per_family) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown families {sorted(unknown)}; known: {list(FAMILIES)}")
    drafts: dict[str, list[dict[str, Any]]] = {}
    for name, make in FAMILIES.items():
        if name not in per_family:
            continue
        rng = random.Random(f"quantbench-suitegen:{GENERATOR_VERSION}:{split}:{seed}:{name}")
        seen: set[str] = set()
        # Gold answers are kept balanced per question (each new one must be among the least used so far): the
        # closed world has few true facts and many false ones, and a skewed suite rewards always saying no.
        used: dict[str, dict[str, int]] = {}
        out: list[dict[str, Any]] = []
        for _ in range(200 * per_family[name] + 1000):
            if len(out) == per_family[name]:
                break
            state, questions, gold = make(rng)
            request = {"state": state, "questions": questions}
            text = request_text(request)
            if text in seen or split_of(request) != split:
                continue
            for q in questions:
                used.setdefault(q, dict.fromkeys(questions[q].get("criteria") or ("yes", "no"), 0))
            if any(used[q][a] > min(used[q].values()) for q, a in gold.items()):
                continue
            for q, a in gold.items():
                used[q][a] += 1
            seen.add(text)
            out.append({"request": request, "gold": gold})
        if len(out) < per_family[name]:
            raise ValueError(f"family {name!r} has only {len(out)} distinct {split} requests; ask for at most that many")
        drafts[name] = out
    records: list[SuiteRecord] = []
    for i in range(max(per_family.values())):
        for name in drafts:
            if i < len(drafts[name]):
                d = drafts[name][i]
                records.append(SuiteRecord.model_validate({"id": f"{name}-{i:04d}", "benchmark": name, **d}))
    return records


def dumps(records: list[SuiteRecord]) -> str:
    lines = [json.dumps(r.model_dump(mode="json", exclude_defaults=True), ensure_ascii=False) for r in records]
    return "\n".join(lines) + "\n"


def write_default(path: Path = DEFAULT_SUITE_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(generate("eval", DEFAULT_EVAL_SIZE, seed=0)), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write_default())
