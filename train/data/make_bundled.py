#!/usr/bin/env python3
"""Generates the dataset and tokenizer bundled with `liger train`.

Everything here is made up by this script: arithmetic, string reversal, counting,
copying, letter case and a list of plain facts written for it. No outside text is used,
so the output is public domain (CC0) by construction.

    python3 train/data/make_bundled.py          # needs `pip install tokenizers`

writes train/data/dataset.jsonl (one JSON object per line: {"instruction", "input",
"output"} or {"text"}) and train/data/tokenizer.json (byte-level BPE with <pad>, <bos>,
<eos> specials). The output is deterministic (fixed seed), so running it again changes
nothing unless this file changes.
"""

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
SEED = 20261122
ROWS = 3000
VOCAB = 1024
SPECIALS = ["<pad>", "<bos>", "<eos>"]

WORDS = """apple river garden stone cloud bread window candle forest silver
orange planet castle summer winter yellow button pencil rabbit ladder
copper meadow harbor lantern marble pepper saddle thunder velvet wagon
basket bottle carpet dragon engine falcon ginger hammer island jacket
kettle lemon mirror needle oyster parrot quartz rocket shadow tiger
violin walnut zebra anchor bridge cherry dolphin feather guitar helmet""".split()

COLORS = "red blue green yellow black white purple brown".split()
ANIMALS = "cat dog horse cow bird fish fox owl bear goat".split()

# Plain statements of common knowledge, written for this dataset.
FACTS = [
    ("What color is the sky on a clear day?", "Blue."),
    ("How many days are in a week?", "Seven."),
    ("How many legs does a spider have?", "Eight."),
    ("How many legs does a dog have?", "Four."),
    ("What do bees make?", "Honey."),
    ("What is frozen water called?", "Ice."),
    ("Which season comes after winter?", "Spring."),
    ("Which season comes after summer?", "Autumn."),
    ("How many hours are in a day?", "Twenty-four."),
    ("How many months are in a year?", "Twelve."),
    ("What color is grass?", "Green."),
    ("What do cows drink?", "Water."),
    ("Where does the sun rise?", "In the east."),
    ("Where does the sun set?", "In the west."),
    ("What is the opposite of hot?", "Cold."),
    ("What is the opposite of up?", "Down."),
    ("What is the opposite of big?", "Small."),
    ("What is the opposite of day?", "Night."),
    ("How many sides does a triangle have?", "Three."),
    ("How many sides does a square have?", "Four."),
    ("What shape is a ball?", "Round."),
    ("What falls from clouds when it rains?", "Water."),
    ("What do plants need from the sun?", "Light."),
    ("Which animal says moo?", "A cow."),
    ("Which animal barks?", "A dog."),
    ("What is the first letter of the alphabet?", "A."),
    ("What is the last letter of the alphabet?", "Z."),
    ("How many minutes are in an hour?", "Sixty."),
    ("What do you use to write on paper?", "A pen or a pencil."),
    ("What is the color of snow?", "White."),
]

TEXT_TEMPLATES = [
    "The {a} is next to the {b}.",
    "A {c} {n} sat by the {a}.",
    "We saw a {n} near the {a} and the {b}.",
    "The {b} was {c} and the {a} was {d}.",
    "Every morning the {n} walks to the {a}.",
]


def arithmetic(r):
    op = r.choice("+-*")
    if op == "*":
        a, b = r.randint(2, 12), r.randint(2, 12)
        value = a * b
        instruction = r.choice(["Multiply the two numbers.", "Compute the product."])
    elif op == "+":
        a, b = r.randint(0, 99), r.randint(0, 99)
        value = a + b
        instruction = r.choice(["Add the two numbers.", "Compute the sum."])
    else:
        a = r.randint(0, 99)
        b = r.randint(0, a)
        value = a - b
        instruction = r.choice(["Subtract the second number from the first.", "Compute the difference."])
    return {"instruction": instruction, "input": f"{a} {op} {b}", "output": str(value)}


def reverse(r):
    word = r.choice(WORDS)
    return {"instruction": "Reverse the letters of the word.", "input": word, "output": word[::-1]}


def count_letters(r):
    word = r.choice(WORDS)
    return {"instruction": "How many letters are in the word?", "input": word, "output": str(len(word))}


def count_range(r):
    start = r.randint(1, 20)
    end = start + r.randint(2, 6)
    return {
        "instruction": f"Count from {start} to {end}.",
        "input": "",
        "output": " ".join(str(i) for i in range(start, end + 1)),
    }


def copy(r):
    words = " ".join(r.choice(WORDS) for _ in range(r.randint(2, 5)))
    return {"instruction": "Repeat the text exactly.", "input": words, "output": words}


def upper(r):
    word = r.choice(WORDS)
    return {"instruction": "Write the word in capital letters.", "input": word, "output": word.upper()}


def fact(r):
    question, answer = r.choice(FACTS)
    # No "input" key at all: the field is optional.
    return {"instruction": question, "output": answer}


def text(r):
    a, b = r.sample(WORDS, 2)
    c, d = r.sample(COLORS, 2)
    return {"text": r.choice(TEXT_TEMPLATES).format(a=a, b=b, c=c, d=d, n=r.choice(ANIMALS))}


TASKS = [arithmetic, reverse, count_letters, count_range, copy, upper, fact, text]


def main():
    r = random.Random(SEED)
    rows = [r.choice(TASKS)(r) for _ in range(ROWS)]
    data = HERE / "dataset.jsonl"
    with data.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")

    # Train the tokenizer on the exact strings `liger train` tokenizes (the prompt template
    # of train/src/prompt.rs and the responses), so frequent pieces become single tokens.
    def corpus():
        for row in rows:
            if "text" in row:
                yield row["text"]
            else:
                yield "### Instruction:\n" + row["instruction"] + "\n\n"
                if row.get("input"):
                    yield "### Input:\n" + row["input"] + "\n\n"
                yield "### Response:\n"
                yield row["output"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(str(HERE / "tokenizer.json"))
    print(f"{data}: {len(rows)} rows; tokenizer: {tok.get_vocab_size()} tokens")


if __name__ == "__main__":
    main()
