"""A deterministic, generated English corpus for the tiny test model: templated chats and short stories.

Stdlib only, so build_tiny_model.py can import it before deciding whether to build at all.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

Message = dict[str, str]
Conversation = list[Message]
QuestionAnswer = tuple[str, str]

COLORS = ["red", "blue", "green", "yellow", "orange", "purple", "pink", "brown", "black", "white", "gray", "gold"]
ANIMAL_FACTS = {
    "cats": "Cats are small furry animals. They like to sleep, play and chase mice.",
    "dogs": "Dogs are loyal animals. They like to run, play fetch and guard the house.",
    "birds": "Birds have feathers and wings. Most birds can fly and many of them sing.",
    "fish": "Fish live in water. They breathe with gills and swim with their fins.",
    "horses": "Horses are big, strong animals. People ride them and they eat grass and hay.",
    "cows": "Cows live on farms. They eat grass and give us milk.",
    "bees": "Bees are small insects. They visit flowers and make honey.",
    "frogs": "Frogs live near ponds. They jump far and eat flies.",
    "rabbits": "Rabbits have long ears and soft fur. They eat carrots and hop around.",
    "owls": "Owls are birds that hunt at night. They have big eyes and fly without a sound.",
    "elephants": "Elephants are the largest animals on land. They have trunks and remember a lot.",
    "penguins": "Penguins are birds that cannot fly. They swim very well and live where it is cold.",
}
# Word tables: packed several to a line rather than one word per line.
# fmt: off
OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "up": "down", "day": "night", "happy": "sad",
    "old": "new", "open": "closed", "light": "dark", "wet": "dry", "early": "late", "full": "empty",
    "loud": "quiet", "strong": "weak", "high": "low", "easy": "hard", "clean": "dirty", "near": "far",
}
CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin",
    "Egypt": "Cairo", "Canada": "Ottawa", "Peru": "Lima", "Kenya": "Nairobi", "Norway": "Oslo",
    "Greece": "Athens", "Portugal": "Lisbon", "Austria": "Vienna", "Ireland": "Dublin", "Chile": "Santiago",
}
NUMBER_WORDS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
    "December",
]
NAMES = [
    "Anna", "Ben", "Carla", "David", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jack", "Kate", "Leo", "Mia", "Noah",
    "Olivia", "Paul", "Rosa", "Sam", "Tina", "Victor", "Wendy", "Yusuf", "Zoe", "Omar", "Lucy", "Max", "Nina",
    "Oscar", "Ruby", "Tom",
]
FOODS = [
    "apples", "bread", "cheese", "rice", "soup", "carrots", "bananas", "cookies", "eggs", "noodles", "oranges",
    "pears", "potatoes", "tomatoes", "grapes", "lemons", "beans", "cake", "pie", "salad", "honey", "butter",
    "pasta", "pizza", "cherries", "peaches", "muffins", "sandwiches", "berries", "melons",
]
OBJECTS = [
    "book", "chair", "table", "lamp", "window", "door", "cup", "plate", "spoon", "bottle", "pencil", "basket",
    "blanket", "clock", "mirror", "ladder", "bucket", "kite", "ball", "box", "hat", "coat", "shoe", "bag", "key",
    "map", "boat", "bike", "letter", "ticket", "candle", "rope", "shelf", "drum", "umbrella", "wallet",
]
PLACES = [
    "market", "school", "library", "beach", "forest", "village", "city", "station", "harbor", "museum", "bakery",
    "farm", "river", "mountain", "lake", "island", "garden", "kitchen", "park", "bridge",
]
VERBS = [
    "found", "carried", "painted", "opened", "closed", "cleaned", "bought", "sold", "built", "fixed", "dropped",
    "lifted", "washed", "cooked", "read", "wrote", "borrowed", "lost", "moved", "packed", "wrapped", "shared",
    "counted", "checked", "filled", "emptied", "hid", "watched", "visited", "drew",
]
ADJECTIVES = [
    "small", "happy", "quiet", "old", "young", "busy", "lazy", "brave", "little", "large", "shiny", "heavy",
    "bright", "soft", "tiny", "warm", "cheerful", "clever", "gentle", "strange",
]
# fmt: on
WEATHER = ["sunny", "rainy", "cloudy", "windy", "snowy", "foggy", "warm", "cold"]
TIMES = ["in the morning", "at noon", "in the afternoon", "in the evening", "at night", "before lunch"]
GREETINGS = ["hello", "hi", "hey", "good morning", "hi there", "Hello!"]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a friendly assistant. Keep answers short."]


def ask_arithmetic(rng: random.Random) -> QuestionAnswer:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    op = rng.choice(["plus", "minus", "times"])
    if op == "minus" and b > a:
        a, b = b, a
    result = {"plus": a + b, "minus": a - b, "times": a * b}[op]
    question = rng.choice(["what is {a} {op} {b}?", "What is {a} {op} {b}?", "how much is {a} {op} {b}?"])
    return question.format(a=a, op=op, b=b), f"{a} {op} {b} is {result}."


def ask_color(rng: random.Random) -> QuestionAnswer:
    color = rng.choice(COLORS)
    question = rng.choice(["name a color", "Name a color.", "can you name a color?", "tell me a color"])
    answer = rng.choice(["{c}.", "Sure: {c}.", "How about {c}?"]).format(c=color)
    return question, answer[0].upper() + answer[1:]


def ask_animal(rng: random.Random) -> QuestionAnswer:
    animal = rng.choice(sorted(ANIMAL_FACTS))
    question = rng.choice(["tell me about {a}", "Tell me about {a}.", "what do you know about {a}?"])
    return question.format(a=animal), ANIMAL_FACTS[animal]


def ask_opposite(rng: random.Random) -> QuestionAnswer:
    word = rng.choice(sorted(OPPOSITES))
    question = rng.choice(["what is the opposite of {w}?", "What is the opposite of {w}?"])
    return question.format(w=word), f"The opposite of {word} is {OPPOSITES[word]}."


def ask_capital(rng: random.Random) -> QuestionAnswer:
    country = rng.choice(sorted(CAPITALS))
    question = rng.choice(["what is the capital of {c}?", "What is the capital of {c}?"])
    return question.format(c=country), f"The capital of {country} is {CAPITALS[country]}."


def ask_count(rng: random.Random) -> QuestionAnswer:
    limit = rng.randint(2, 12)
    question = rng.choice(["count to {n}", "Count to {n}.", "can you count to {n}?"])
    return question.format(n=limit), ", ".join(str(i) for i in range(1, limit + 1)) + "."


def ask_number_word(rng: random.Random) -> QuestionAnswer:
    number = rng.randint(0, len(NUMBER_WORDS) - 1)
    return f"how do you write {number} in words?", f"{number} is written as {NUMBER_WORDS[number]}."


def ask_next_in_sequence(rng: random.Random) -> QuestionAnswer:
    kind, items = rng.choice([("day", DAYS), ("month", MONTHS)])
    index = rng.randrange(len(items))
    following = items[(index + 1) % len(items)]
    return f"what {kind} comes after {items[index]}?", f"After {items[index]} comes {following}."


def ask_spelling(rng: random.Random) -> QuestionAnswer:
    word = rng.choice(OBJECTS + FOODS)
    return f"how do you spell {word}?", f"{word} is spelled {'-'.join(word)}."


def ask_story(rng: random.Random) -> QuestionAnswer:
    question = rng.choice(["tell me a story", "Tell me a short story.", "write a story about {n}"])
    name = rng.choice(NAMES)
    return question.format(n=name), build_story(rng, name)


def greet(rng: random.Random) -> QuestionAnswer:
    answer = rng.choice(["Hello! How can I help you today?", "Hi! What can I do for you?"])
    return rng.choice(GREETINGS), answer


ASKERS: list[Callable[[random.Random], QuestionAnswer]] = [
    ask_arithmetic,
    ask_arithmetic,
    ask_arithmetic,
    ask_color,
    ask_animal,
    ask_opposite,
    ask_capital,
    ask_count,
    ask_number_word,
    ask_next_in_sequence,
    ask_spelling,
    ask_story,
    greet,
]


def build_conversation(rng: random.Random) -> Conversation:
    """One chat: an optional system prompt, then one to three user/assistant turns."""
    conversation: Conversation = []
    if rng.random() < 0.3:
        conversation.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for _ in range(rng.choice([1, 1, 2, 3])):
        question, answer = rng.choice(ASKERS)(rng)
        conversation.append({"role": "user", "content": question})
        conversation.append({"role": "assistant", "content": answer})
    return conversation


def build_conversations(num_conversations: int, seed: int) -> list[Conversation]:
    rng = random.Random(seed)
    return [build_conversation(rng) for _ in range(num_conversations)]


def build_story_sentence(rng: random.Random, name: str) -> str:
    templates = [
        "{name} {verb} the {adj} {obj} {time}.",
        "It was {weather} at the {place} on {day}.",
        "{name} went to the {place} and bought {n} {food}.",
        "In {month}, {name} and {friend} {verb} a {adj} {obj}.",
        "The {adj} {animal} near the {place} was {weather} and {adj2}.",
        "{name} had {n} {food} and gave {m} of them to {friend}.",
    ]
    return rng.choice(templates).format(
        name=name, friend=rng.choice(NAMES), verb=rng.choice(VERBS), adj=rng.choice(ADJECTIVES),
        adj2=rng.choice(ADJECTIVES), obj=rng.choice(OBJECTS), time=rng.choice(TIMES), weather=rng.choice(WEATHER),
        place=rng.choice(PLACES), day=rng.choice(DAYS), month=rng.choice(MONTHS), food=rng.choice(FOODS),
        animal=rng.choice(sorted(ANIMAL_FACTS)), n=rng.randint(2, 999), m=rng.randint(1, 9),
    )  # fmt: skip


def build_story(rng: random.Random, name: str) -> str:
    return " ".join(build_story_sentence(rng, name) for _ in range(rng.randint(2, 4)))


def build_paragraphs(num_paragraphs: int, seed: int) -> list[str]:
    """Plain text stories; some span two paragraphs so the tokenizer and model see newlines."""
    rng = random.Random(seed + 1)
    stories = []
    for _ in range(num_paragraphs):
        name = rng.choice(NAMES)
        parts = [build_story(rng, name) for _ in range(rng.choice([1, 1, 2]))]
        stories.append("\n\n".join(parts))
    return stories


def iter_plain_texts(conversations: list[Conversation], paragraphs: list[str]) -> Iterator[str]:
    """Every piece of text as the chat template lays it out, minus special tokens, for the tokenizer."""
    for conversation in conversations:
        for message in conversation:
            yield f"{message['role']}\n\n{message['content']}"
    yield from paragraphs
