"""Writes preference.jsonl and kto.jsonl: the bundled data of `liger train --method
dpo|orpo|cpo|simpo` and `--method kto`, derived from dataset.jsonl (so public domain by
construction too).

- preference.jsonl: TRL's standard preference format, {"prompt", "chosen", "rejected"}:
  the prompt is an instruction row's prompt in `liger train`'s template, the chosen
  completion its output, the rejected one the output of another row of the same task
  (a wrong answer of the right form: 129 for 80 + 49 rejected against another sum).
- kto.jsonl: TRL's unpaired format, {"prompt", "completion", "label"}: each prompt once,
  with its own output (label true) or another row's (label false), alternating.

Deterministic (fixed seed): python3 train/data/make_preference.py
"""

import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
PAIRS = 1000


def prompt(row):
    inp = row.get("input")
    if inp:
        return f"### Instruction:\n{row['instruction']}\n\n### Input:\n{inp}\n\n### Response:\n"
    return f"### Instruction:\n{row['instruction']}\n\n### Response:\n"


rows = []
with open(os.path.join(HERE, "dataset.jsonl")) as f:
    for line in f:
        r = json.loads(line)
        if "instruction" in r:
            rows.append(r)

by_task = {}
for r in rows:
    by_task.setdefault(r["instruction"], []).append(r)

rng = random.Random(14)
pairs = []
for r in rows:
    others = [o for o in by_task[r["instruction"]] if o["output"] != r["output"]]
    if not others:
        continue
    pairs.append((r, rng.choice(others)["output"]))
rng.shuffle(pairs)
pairs = pairs[:PAIRS]

with open(os.path.join(HERE, "preference.jsonl"), "w") as f:
    for r, wrong in pairs:
        f.write(json.dumps({"prompt": prompt(r), "chosen": r["output"], "rejected": wrong}) + "\n")

with open(os.path.join(HERE, "kto.jsonl"), "w") as f:
    for i, (r, wrong) in enumerate(pairs):
        good = i % 2 == 0
        f.write(json.dumps({"prompt": prompt(r), "completion": r["output"] if good else wrong, "label": good}) + "\n")
print(f"wrote {len(pairs)} pairs and {len(pairs)} KTO rows")
