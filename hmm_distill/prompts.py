"""The built-in task prompt set: tool-call, JSON and keyword prompts.

``hmm_distill/data/task_prompts.jsonl`` (one chat prompt per line: ``user``,
optional ``system`` and ``tools``, plus ``id`` and ``kind``) is generated
deterministically from the templates below by :func:`generate_task_prompts`
(``python -m hmm_distill.prompts`` rewrites the file); nothing is downloaded. It
holds the kinds of requests ``jaxcd generate --tool / --schema / --keywords`` meets,
so an HMM distilled on continuations of these prompts models the text P-GCD decodes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

DATA_FILE = Path(__file__).with_name("data") / "task_prompts.jsonl"
TOOL_PROMPTS_FILE = Path(__file__).with_name("data") / "tool_prompts.jsonl.gz"


def builtin_prompts_path() -> Path:
    """The built-in task prompt file (tool-call, JSON and keyword prompts)."""
    return DATA_FILE


def tool_prompts_path() -> Path:
    """The BFCL tool-call prompt set that no study evaluates (written by
    ``python -m experiments.distill_prompts``; JSON lines, gzip-compressed)."""
    return TOOL_PROMPTS_FILE


def builtin_prompt_set_hash() -> str:
    """SHA-256 (16 hex digits) of the built-in prompt file's bytes."""
    return hashlib.sha256(DATA_FILE.read_bytes()).hexdigest()[:16]


def _obj(props: dict, required=None) -> dict:
    return {"type": "object", "properties": props, "required": list(required or props)}


S, I, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}

TOOLS = [
    ({"name": "get_weather", "description": "Current weather for a city",
      "parameters": _obj({"city": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"])},
     ["What's the weather like in {city}?", "Is it cold in {city} right now? Use {unit}.",
      "Tell me the temperature in {city}."]),
    ({"name": "search_flights", "description": "Search flights between two airports",
      "parameters": _obj({"origin": S, "destination": S, "date": S, "passengers": I}, ["origin", "destination", "date"])},
     ["Find me a flight from {city} to {city2} on {date}.",
      "I need {n} seats from {city} to {city2}, leaving {date}."]),
    ({"name": "send_email", "description": "Send an email",
      "parameters": _obj({"to": S, "subject": S, "body": S})},
     ["Email {person} that the meeting moved to {time}.", "Send {person} a thank-you note about {topic}."]),
    ({"name": "create_event", "description": "Add an event to the calendar",
      "parameters": _obj({"title": S, "date": S, "time": S, "duration_minutes": I}, ["title", "date"])},
     ["Put '{topic} review' on my calendar for {date} at {time}.",
      "Schedule a {n}0-minute call about {topic} on {date}."]),
    ({"name": "convert_currency", "description": "Convert an amount between currencies",
      "parameters": _obj({"amount": N, "from": S, "to": S})},
     ["How much is {n}00 {cur} in {cur2}?", "Convert {n}5.50 {cur} to {cur2}."]),
    ({"name": "get_stock_price", "description": "Latest price of a stock",
      "parameters": _obj({"ticker": S})},
     ["What is {ticker} trading at?", "Give me the latest price of {ticker}."]),
    ({"name": "set_timer", "description": "Start a countdown timer",
      "parameters": _obj({"minutes": I, "label": S}, ["minutes"])},
     ["Set a timer for {n} minutes for the {food}.", "Remind me in {n}0 minutes to check the {food}."]),
    ({"name": "translate_text", "description": "Translate text",
      "parameters": _obj({"text": S, "target_language": S})},
     ["Translate 'where is the station' into {lang}.", "How do you say '{food} please' in {lang}?"]),
    ({"name": "book_restaurant", "description": "Reserve a table",
      "parameters": _obj({"restaurant": S, "party_size": I, "time": S, "vegetarian": B}, ["restaurant", "party_size", "time"])},
     ["Book a table for {n} at Luigi's at {time}.", "Reserve dinner for {n} people at {time}, vegetarian options please."]),
    ({"name": "lookup_contact", "description": "Find a contact's details",
      "parameters": _obj({"name": S, "field": {"type": "string", "enum": ["phone", "email", "address"]}})},
     ["What's {person}'s phone number?", "Find the email address of {person}."]),
]

SCHEMAS = [
    ("a person", _obj({"name": S, "age": I, "email": S}), ["{person}, {n}0 years old"]),
    ("a product", _obj({"name": S, "price": N, "in_stock": B}), ["a {food} that costs {n} dollars"]),
    ("an address", _obj({"street": S, "city": S, "zip": S}), ["an office in {city}"]),
    ("a book", _obj({"title": S, "author": S, "year": I, "genres": {"type": "array", "items": S}}),
     ["a novel about {topic}"]),
    ("an event", _obj({"title": S, "date": S, "location": S, "attendees": {"type": "array", "items": S}}),
     ["a {topic} workshop in {city} on {date}"]),
    ("an order", _obj({"order_id": S, "items": {"type": "array", "items": _obj({"name": S, "quantity": I})},
                       "total": N}), ["{n} {food}s"]),
    ("a recipe", _obj({"name": S, "servings": I, "ingredients": {"type": "array", "items": S}}),
     ["{food} soup for {n}"]),
    ("a weather report", _obj({"city": S, "temperature_c": N, "conditions": S}), ["today in {city}"]),
    ("a movie review", _obj({"title": S, "rating": I, "summary": S}), ["a film about {topic}"]),
    ("a task", _obj({"title": S, "priority": {"type": "string", "enum": ["low", "medium", "high"]},
                     "done": B}), ["finishing the {topic} report"]),
]

KEYWORD_TASKS = [
    "Write one sentence that uses the words {w}.",
    "Write a short product description mentioning {w}.",
    "Write a headline containing {w}.",
    "Describe your weekend in two sentences using {w}.",
]
WORDS = [("ocean", "coffee"), ("mountain", "bicycle", "sunrise"), ("library", "quiet"),
         ("robot", "garden"), ("winter", "train", "letter"), ("market", "orange"),
         ("music", "river"), ("window", "cat", "rain"), ("pizza", "friends"),
         ("forest", "lantern"), ("deadline", "team"), ("camera", "beach", "wave"),
         ("doctor", "smile"), ("rocket", "moon"), ("bread", "morning")]

FILL = {
    "city": ["Paris", "Tokyo", "Berlin", "Lima", "Cairo", "Oslo", "Toronto", "Seoul"],
    "city2": ["Madrid", "Boston", "Nairobi", "Sydney", "Rome", "Delhi"],
    "date": ["March 3", "next Friday", "2025-07-14", "tomorrow", "June 21"],
    "n": ["2", "3", "4", "6"],
    "person": ["Alice", "Bob", "Dr. Chen", "Maria", "Sam"],
    "time": ["9am", "3:30 pm", "noon", "18:00"],
    "topic": ["budget", "design", "robotics", "gardening", "history", "marketing"],
    "cur": ["USD", "EUR", "JPY"], "cur2": ["GBP", "CHF", "INR"],
    "ticker": ["AAPL", "MSFT", "NVDA", "TSLA", "AMZN"],
    "food": ["pasta", "cake", "tomato", "rice", "bread"],
    "lang": ["French", "Spanish", "German", "Japanese"],
    "unit": ["celsius", "fahrenheit"],
}

TOOL_SYSTEM = ('You are a function-calling assistant. Answer with one JSON object '
               '{"name": <tool name>, "arguments": {...}} and nothing else.')
JSON_SYSTEM = "You answer with JSON only, following the given schema."


def _fill(template: str, k: int) -> str:
    out = template
    for j, (name, vals) in enumerate(sorted(FILL.items())):
        out = out.replace("{" + name + "}", vals[(k * (j + 3) + j) % len(vals)])
    return out


def generate_task_prompts(per_template: int = 4) -> list[dict]:
    """The built-in prompts (deterministic): tool calls, JSON objects, keyword sentences."""
    out = []
    for tool, templates in TOOLS:
        for t, k in itertools.product(templates, range(per_template)):
            out.append({"kind": "tool", "system": TOOL_SYSTEM, "tools": [tool], "user": _fill(t, k)})
    for what, schema, subjects in SCHEMAS:
        for subj, k in itertools.product(subjects, range(per_template)):
            s = _fill(subj, k)
            user = [f"Give me {what} as JSON: {s}.",
                    f"Return a JSON object describing {what} ({s}) with this schema: {json.dumps(schema)}",
                    f"Create {what} record for {s}. Output JSON matching {json.dumps(schema)}",
                    f"Fill in {what} for {s} as a JSON object."][k % 4]
            out.append({"kind": "json", "system": JSON_SYSTEM, "user": user})
    for k, words in enumerate(WORDS):
        for j, task in enumerate(KEYWORD_TASKS):
            if (k + j) % 2:
                continue
            w = ", ".join(f"'{x}'" for x in words[:-1]) + f" and '{words[-1]}'"
            out.append({"kind": "keywords", "user": task.format(w=w)})
    # drop exact duplicates (the templates may fill the same way twice), keep order
    seen, uniq = set(), []
    for p in out:
        key = json.dumps(p, sort_keys=True)
        if key not in seen:
            seen.add(key)
            uniq.append(p)
    for i, p in enumerate(uniq):
        p["id"] = f"{p['kind']}-{i:03d}"
    return uniq


def write_task_prompts(path: Path = DATA_FILE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(p, sort_keys=True) for p in generate_task_prompts()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


if __name__ == "__main__":
    p = write_task_prompts()
    print(f"wrote {sum(1 for _ in p.open())} prompts to {p}")
