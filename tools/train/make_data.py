#!/usr/bin/env python3
"""Builds the mini model's training conversations from public-domain Debian text.

Sources (Debian packages, both free of copyright restrictions on use):
  wordnet-base  /usr/share/wordnet/index.* and data.*: every single-word lemma that has at least one
                sense in WordNet's semantically tagged corpus (tagsense_cnt > 0), with its senses in
                WordNet's frequency order;
  fortunes-min  /usr/share/games/fortunes/{fortunes,literature,riddles}: short quotations.

Output: one chat request per line (the shape `dsv4 render` reads), family deepseek_v4, chat mode.
Each conversation holds 1..4 turns: definition questions in several phrasings, "what else can it
mean" follow-ups that walk down the senses, and a little small talk. Standard library only, so it
runs wherever the packages are installed; the draw is seeded, so the same packages give the same
file.

    python3 tools/train/make_data.py --seed 1 --conversations 240000 > convs.jsonl
"""
import argparse
import json
import os
import random
import re
import sys

WN = "/usr/share/wordnet"
FORTUNES = "/usr/share/games/fortunes"
POS = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}

IDENTITY = ("I am dsv4 mini, a small DeepSeek-V4 model trained on the WordNet dictionary. "
            "Ask me what a word means.")


def read_glosses():
    """offset by pos -> (words, gloss) from data.*; adjective satellites ('s') count as 'a'."""
    out = {}
    for name, p in POS.items():
        table = {}
        with open(os.path.join(WN, "data." + name), encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                head, _, gloss = line.partition("|")
                table[head.split()[0]] = gloss.strip()
        out[p] = table
    return out


def read_index(glosses):
    """lemma -> list of (pos, gloss) in WordNet's sense order, tagged lemmas only."""
    words = {}
    for name, p in POS.items():
        with open(os.path.join(WN, "index." + name), encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                t = line.split()
                lemma = t[0]
                if not re.fullmatch(r"[a-z]{2,}", lemma):
                    continue
                n_syn, n_ptr = int(t[2]), int(t[3])
                tagged = int(t[5 + n_ptr])
                if tagged <= 0:
                    continue
                offsets = t[6 + n_ptr:6 + n_ptr + n_syn]
                for off in offsets[:4]:
                    g = glosses[p].get(off)
                    if g:
                        words.setdefault(lemma, []).append((p, g))
    return words


def split_gloss(g):
    """'definition; "example"; "example"' -> (definition, first example or None)."""
    parts = [s.strip() for s in g.split(";")]
    defs = [s for s in parts if s and not s.startswith('"')]
    exs = [s.strip('"') for s in parts if s.startswith('"') and s.endswith('"') and len(s) > 2]
    d = defs[0] if defs else ""
    d = re.sub(r"\s+", " ", d).strip()
    return d, (exs[0] if exs else None)


def article(w):
    return "An" if w[0] in "aeiou" else "A"


def answer(w, p, gloss, rng):
    d, ex = split_gloss(gloss)
    if not d:
        return None
    if p == "n":
        if re.match(r"(a|an|any|one|someone|something)\b", d):
            s = f"{article(w)} {w} is {d}."
        elif re.match(r"the\b", d):
            s = f"{w.capitalize()} is {d}."
        else:
            s = f"{w.capitalize()} means {d}."
    elif p == "v":
        s = f"To {w} means to {d}."
    else:
        s = f"{w.capitalize()} means {d}."
    if ex and rng.random() < 0.5 and len(ex) < 120:
        s += f' For example: "{ex}".'
    return s


QUESTIONS = ["What does {w} mean?", "What does {w} mean?", "What does the word {w} mean?",
             "What is the meaning of {w}?", "Define {w}.", "Can you tell me what {w} means?",
             "What does \"{w}\" mean?", "Explain the word {w}."]
FOLLOW = ["What else can it mean?", "Does it have another meaning?", "Any other meaning?"]
SMALL = [(["Hello", "Hello!", "Hi", "Hi!", "Hello there"],
          ["Hello! Ask me what a word means.", "Hi! Which word would you like to know about?"]),
         (["Who are you?", "What are you?", "What can you do?"], [IDENTITY]),
         (["Thank you", "Thanks!", "Thank you very much."], ["You are welcome.", "Glad to help."])]


def read_fortunes():
    out = []
    for name in ("fortunes", "literature", "riddles"):
        path = os.path.join(FORTUNES, name)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for block in f.read().split("\n%\n"):
                b = block.strip()
                if 20 < len(b) < 300:
                    out.append(b)
    return out


def conversation(words, keys, fortunes, rng):
    msgs = []
    for _ in range(rng.choice([1, 1, 2, 2, 3, 4])):
        r = rng.random()
        if r < 0.06:
            qs, ans = rng.choice(SMALL)
            msgs += [{"role": "user", "content": rng.choice(qs)},
                     {"role": "assistant", "content": rng.choice(ans)}]
            continue
        if r < 0.09 and fortunes:
            msgs += [{"role": "user", "content": rng.choice(["Tell me a fortune.", "Give me a quotation."])},
                     {"role": "assistant", "content": rng.choice(fortunes)}]
            continue
        w = rng.choice(keys)
        senses = words[w]
        a = answer(w, *senses[0], rng)
        if not a:
            continue
        msgs += [{"role": "user", "content": rng.choice(QUESTIONS).format(w=w)},
                 {"role": "assistant", "content": a}]
        for p, g in senses[1:3]:
            if rng.random() < 0.35:
                a = answer(w, p, g, rng)
                if a:
                    msgs += [{"role": "user", "content": rng.choice(FOLLOW)},
                             {"role": "assistant", "content": a}]
            else:
                break
    return msgs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--conversations", type=int, default=240000)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    words = read_index(read_glosses())
    keys = sorted(words)
    fortunes = read_fortunes()
    print(f"make_data: {len(keys)} words, {len(fortunes)} quotations", file=sys.stderr)
    n = 0
    while n < a.conversations:
        msgs = conversation(words, keys, fortunes, rng)
        if not msgs:
            continue
        req = {"family": "deepseek_v4", "thinking_mode": "chat", "add_generation_prompt": False, "messages": msgs}
        sys.stdout.write(json.dumps(req, ensure_ascii=False) + "\n")
        n += 1


if __name__ == "__main__":
    main()
