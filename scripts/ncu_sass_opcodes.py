#!/usr/bin/env python3
"""Executed instructions by SASS opcode, per kernel, from Nsight Compute's source page.

    ncu --import-source yes --section SourceCounters -o REPORT <command>
    ncu -i REPORT.ncu-rep --page source --print-source sass --csv > SASS.csv
    python3 scripts/ncu_sass_opcodes.py SASS.csv [TOP]

Prints, for each kernel in the file, the executed warp instructions in millions, then the
TOP opcodes (default 30) by count (predicated-off instructions count: they still issue).
"""
import collections
import csv
import sys


def kernels(path):
    out, cur, header = [], None, None
    for row in csv.reader(open(path)):
        if row and row[0] == "Kernel Name":
            cur = {"name": row[1], "ins": []}
            out.append(cur)
            header = None
        elif row and row[0] == "Address":
            header = row
        elif header and cur is not None and row:
            cur["ins"].append(dict(zip(header, row)))
    return out


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    for k in kernels(path):
        by_opcode = collections.Counter()
        for ins in k["ins"]:
            words = ins["Source"].split()
            if not words:
                continue
            opcode = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
            by_opcode[opcode.split(".")[0]] += number(ins["Instructions Executed"])
        total = sum(by_opcode.values())
        print(f"{k['name']}: {len(k['ins'])} instructions, {total / 1e6:.1f} M executed")
        print("  " + ", ".join(f"{op} {n / 1e6:.1f}" for op, n in by_opcode.most_common(top)))


if __name__ == "__main__":
    main()
