"""Chat prompts for self-distilling a chat head (`multispec train draft --self-distill N`): conversations of the
six kinds of the shared question format, written here from templates and word lists of this project's own
writing, none of them an evaluation question (`multispec/bench/data/chat_questions.jsonl`; checked below).
Each conversation holds user turns and empty assistant turns, which the target writes itself.

    python benchmarks/probes/chat_train_prompts.py --out chat_train.jsonl [--count 320] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

THINGS = ["a kettle", "a garden hose", "a paper map", "a rowing boat", "a wool scarf", "a desk lamp", "a violin",
          "a compost bin", "a sewing machine", "a telescope", "a tram ticket", "a wooden spoon", "a bird feeder",
          "a pocket watch", "a chess clock", "a snow shovel", "a bread oven", "a tent", "a fountain pen", "a radio"]
PLACES = ["a harbour town", "a mountain village", "a busy train station", "a night market", "a small bakery",
          "a school library", "a fishing boat", "a farm in autumn", "a city rooftop", "a quiet museum",
          "a bicycle workshop", "a desert camp", "a ferry crossing", "a flower shop", "a ski hut"]
ROLES = ["a ship's cook", "a museum guard", "a beekeeper", "a night-train conductor", "a village postman",
         "a mountain guide", "a puppet maker", "a radio host", "a park ranger", "a clock repairer", "a baker"]
TOPICS = ["how tides work", "why bread rises", "how a refrigerator keeps food cold", "why leaves change colour",
          "how a compass finds north", "what causes thunder", "how vaccines train the immune system",
          "why ice floats on water", "how a bicycle stays upright", "what a black hole is", "how rainbows form",
          "why the moon has phases", "how solar panels make electricity", "why salt melts ice on roads",
          "how bees make honey", "what an earthquake is", "how a lock and key work", "why we yawn"]
HUMANITIES = ["a letter and an email", "a fable and a fairy tale", "a biography and an autobiography",
              "a museum and an archive", "a poem and a song", "a newspaper and a magazine", "a myth and a legend",
              "a play and a film", "a speech and an essay", "a map and a globe"]
CODE_TASKS = ["counts the vowels in a string", "reverses the words in a sentence", "checks whether a number is prime",
              "merges two sorted lists into one sorted list", "removes duplicates from a list but keeps the order",
              "returns the most common word in a text", "converts Celsius to Fahrenheit for a list of values",
              "checks whether a string is a palindrome, ignoring spaces", "groups words by their first letter",
              "finds the longest run of equal items in a list", "computes the running total of a list of numbers",
              "splits a list into chunks of a given size", "counts how often each character appears in a string"]
SENTENCES = ["The museum opens at ten and closes at six.", "My grandmother grows tomatoes on her balcony.",
             "We missed the last bus and walked home under the stars.", "The soup needs more salt and a little pepper.",
             "Our teacher read us a story about a brave fox.", "The bridge was closed because of the strong wind.",
             "He forgot his umbrella at the café again.", "The children built a snowman in the park.",
             "Please send me the report before Friday.", "The train to the coast leaves every hour.",
             "She painted the kitchen a light shade of green.", "The market sells cheese, bread and fresh fish."]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Swedish"]
NAMES = ["Mira", "Tomas", "Lena", "Ravi", "Ines", "Jonah", "Aiko", "Pablo", "Greta", "Omar", "Nadia", "Felix"]
FACT_QUESTIONS = ["What is the largest ocean on Earth?", "How many legs does a spider have?",
                  "What is the capital of Canada?", "Which organ pumps blood through the body?",
                  "What is the freezing point of water in Fahrenheit?", "How many sides does a hexagon have?",
                  "What do we call a baby kangaroo?", "Which metal is liquid at room temperature?",
                  "What is the longest river in Africa?", "How many continents are there?",
                  "What instrument has 88 keys?", "What is the main ingredient of guacamole?",
                  "Why is the sea salty?", "What is photosynthesis?", "What does a barometer measure?",
                  "Why do cats purr?", "What is the difference between a lake and a pond?"]


def _passage(rng: random.Random) -> tuple[str, str]:
    """A short made-up notice and a question answerable from it."""
    name, place = rng.choice(NAMES), rng.choice(["community garden", "swimming club", "choir", "repair café",
                                                  "chess club", "reading group", "cycling club"])
    day, hour, fee = rng.choice(["Monday", "Wednesday", "Saturday", "Sunday"]), rng.randint(8, 19), rng.randint(2, 30)
    text = (f"The {place} meets every {day} at {hour}:00. New members pay {fee} euros for the first month and "
            f"nothing after that. {name} organises the meetings; questions go to the notice board by the door. "
            f"Bring your own cup; tea is free.")
    question = rng.choice([f"On which day and at what time does the {place} meet?", "How much does a new member pay?",
                           "Who organises the meetings, and where do questions go?", "What should members bring?"])
    return text, question


def _story(rng: random.Random) -> str:
    """A paragraph of a few invented sentences to summarise."""
    name, place, thing = rng.choice(NAMES), rng.choice(PLACES), rng.choice(THINGS)
    return (f"Last spring {name} moved to {place} and opened a small repair shop. At first only a few neighbours "
            f"came, mostly with broken umbrellas and loose chair legs. One day a fisherman brought {thing} that no "
            f"one else could fix, and {name} worked on it for three evenings until it was as good as new. Word "
            f"spread quickly. By the end of the summer the shop had a waiting list, and {name} hired two students "
            f"to help on weekends. The town now holds a yearly fair where people swap tools and tips.")


def conversations(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    makers = [
        lambda: [f"Write a short friendly message inviting a friend to visit {rng.choice(PLACES)} with you.",
                 "Make it more formal."],
        lambda: [f"Describe {rng.choice(THINGS)} to someone who has never seen one.", "Now do it in three sentences."],
        lambda: [f"You are {rng.choice(ROLES)}. Tell me about the best day of your working life.",
                 "What was the hardest day?"],
        lambda: [f"Explain {rng.choice(TOPICS)} to a ten-year-old.", "Give a short example from everyday life."],
        lambda: [f"What is the difference between {rng.choice(HUMANITIES)}?", "Give one example of each."],
        lambda: [f"Write a Python function that {rng.choice(CODE_TASKS)}.", "Explain how your function works."],
        lambda: [f"Translate into {rng.choice(LANGUAGES)}: {rng.choice(SENTENCES)}"],
        lambda: [f"Translate into English: {rng.choice(['Il pleut depuis ce matin.', 'Ich habe heute keine Zeit.', 'La tienda abre a las nueve.', 'Il treno è in ritardo.', 'Vamos jantar juntos amanhã.'])}"],
        lambda: [f"Summarize the following text in two sentences.\n\n{_story(rng)}"],
        lambda: [rng.choice(FACT_QUESTIONS)],
        lambda: [f"{rng.choice(NAMES)} buys {rng.randint(3, 9)} notebooks at {rng.randint(2, 7)} euros each and pays "
                 f"with a {rng.choice([50, 100])} euro note. How much change is given? Show your steps."],
        lambda: [f"A garden is {rng.randint(4, 15)} metres long and {rng.randint(3, 12)} metres wide. What is its "
                 f"area, and how much fence goes around it? Explain.", "What if both sides were doubled?"],
        lambda: [f"A cyclist rides {rng.randint(12, 60)} km in {rng.randint(1, 4)} hours. What is the average speed? "
                 f"Explain briefly."],
        lambda: (lambda p: [f"Answer the question using only the information below.\n\n{p[0]}\n\nQuestion: {p[1]}"])(
            _passage(rng)),
    ]
    out, seen = [], set()
    while len(out) < count:
        turns = rng.choice(makers)()
        if turns[0] in seen:
            continue
        seen.add(turns[0])
        messages = []
        for t in turns:
            messages += [{"role": "user", "content": t}, {"role": "assistant", "content": ""}]
        out.append({"messages": messages})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=320)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    convs = conversations(args.count, args.seed)
    shipped = Path(__file__).resolve().parents[2] / "multispec/bench/data/chat_questions.jsonl"
    evaluation = {t for line in shipped.read_text().splitlines() for t in json.loads(line)["turns"]}
    overlap = [m["content"] for c in convs for m in c["messages"] if m["content"] in evaluation]
    if overlap:
        raise SystemExit(f"an evaluation question among the training prompts: {overlap[0]!r}")
    Path(args.out).write_text("".join(json.dumps(c) + "\n" for c in convs))
    print(f"{len(convs)} conversations -> {args.out}")


if __name__ == "__main__":
    main()
