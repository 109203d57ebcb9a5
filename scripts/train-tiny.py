#!/usr/bin/python3
"""Train two tiny language models on a generated story corpus and export them for kvlab (issue #14).

Run with Debian's interpreter, which has python3-torch (1.13) and python3-numpy:

    nice -n 19 /usr/bin/python3 scripts/train-tiny.py            # everything: corpus, tokenizer, both models
    nice -n 19 /usr/bin/python3 scripts/train-tiny.py --reference-only   # only models/reference.json, from the exports

Everything is deterministic: the corpus comes from a seeded grammar, the tokenizer from that corpus, and the
models from fixed seeds, a fixed number of steps, a fixed thread count and torch.use_deterministic_algorithms.
No network, no third-party packages beyond torch and numpy.

Outputs (under --out, default models/):
    tokenizer.bin            llama2.c tokenizer format, 512 tokens, shared by both models
    heldout.txt              the held-out story the reference NLL is computed on (exact bytes, no trailing newline)
    tiny-llama/model.bin     Llama-family model, llama2.c legacy v0 checkpoint (tied classifier)
    tiny-gpt2/config.json    GPT-2-family model, Hugging Face directory
    tiny-gpt2/model.safetensors
    reference.json           prompts, token ids, logits, greedy continuations and held-out NLL from PyTorch
    train-log.json           loss curves and timings of the run that wrote the files

The model code is written from the papers (Llama: RMSNorm, RoPE, GQA, SwiGLU; GPT-2: pre-LN transformer with
learned positions and the tanh GELU), not from kvlab's C++, so that kvlab can be checked against it.
"""

import argparse
import hashlib
import json
import math
import os
import random
import re
import struct
import sys
import time

# One BLAS / OpenMP thread unless --threads says otherwise, fixed before torch loads: results depend on the thread
# count, and on a busy 2-core machine more threads only spin against each other.
_THREADS = next((a.split("=", 1)[1] if "=" in a else sys.argv[i + 2] for i, a in enumerate(sys.argv[1:])
                 if a.startswith("--threads")), "1")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _THREADS

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------------------------
# 1. Corpus: children's stories from a small random grammar
# ---------------------------------------------------------------------------------------------------------------

GIRLS = ["Lily", "Mia", "Sue", "Anna", "Lucy", "Emma", "Zoe", "Ella", "Rose", "Kate", "Amy", "Jane"]
BOYS = ["Tom", "Ben", "Max", "Sam", "Jack", "Tim", "Leo", "Finn", "Bob", "Joe", "Dan", "Ned"]

# kind -> (home sentence templates, things it likes doing with its toy)
KINDS = {
    "girl": ["lived in a small house near the {place}", "lived with {poss} mom and dad in a little house"],
    "boy": ["lived in a small house near the {place}", "lived with {poss} mom and dad in a little house"],
    "cat": ["lived with a kind family in a big house", "liked to sleep in the warm sun"],
    "dog": ["lived with a kind family in a big house", "liked to run fast in the grass"],
    "bunny": ["lived in a hole under an old tree", "liked to eat carrots in the garden"],
    "bird": ["lived in a nest in a tall tree", "liked to sing in the morning"],
    "owl": ["lived in a nest in a tall tree", "liked to look at the moon at night"],
    "duck": ["lived by a quiet pond", "liked to swim in the cool water"],
    "bear": ["lived in a cave in the woods", "liked to eat sweet honey"],
    "fox": ["lived in a hole under an old tree", "liked to play in the tall grass"],
}
PEOPLE = ["girl", "boy"]
ANIMALS = ["cat", "dog", "bunny", "bird", "owl", "duck", "bear", "fox"]
CHAR_ADJ = ["little", "happy", "kind", "brave", "shy", "small", "funny", "curious", "old", "sweet"]
PLACES = ["park", "forest", "garden", "beach", "farm", "hill", "pond", "woods", "river", "meadow"]
# toy noun -> what one does with it
TOYS = {
    "ball": "play with", "kite": "fly", "boat": "sail", "hat": "wear", "book": "read", "drum": "play",
    "teddy bear": "hug", "doll": "play with", "toy car": "push", "balloon": "hold", "blanket": "hold",
    "umbrella": "hold",
}
TOY_ADJ = ["red", "blue", "green", "yellow", "big", "little", "shiny", "soft", "old", "new", "orange", "pink"]
FINDS = ["shell", "stone", "feather", "flower", "leaf", "egg", "key", "coin", "ring", "acorn"]
FIND_ADJ = ["shiny", "pretty", "smooth", "tiny", "big", "odd", "orange", "white", "golden", "old"]
FOODS = {"apple": "apples", "cookie": "cookies", "cherry": "cherries", "orange": "oranges", "cupcake": "cupcakes",
         "banana": "bananas", "strawberry": "strawberries", "candy": "candies", "peach": "peaches"}
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six"]
HIDING = ["under a big rock", "in the tall grass", "next to the pond", "behind a tree", "under the bed",
          "in a box", "near the fence", "under a bush"]
FAMILY = ["mom", "dad", "grandma", "grandpa"]
FEELINGS_GOOD = ["happy", "glad", "proud", "excited"]
ENDINGS_FRIENDS = [
    "From that day on, {a} and {b} were best friends.",
    "{a} and {b} played together until the sun went down.",
    "After that, {a} and {b} always played together.",
]
MORALS = {
    "lost": ["{a} learned that friends help each other.", "{a} learned to take good care of {poss} things."],
    "find": ["{a} learned that the world is full of surprises.", "It was the best day ever."],
    "share": ["{a} learned that sharing makes everyone happy.", "{a} learned that it is good to share."],
    "storm": ["{a} learned that storms do not last forever.", "{a} was not scared of the rain anymore."],
    "help": ["{a} learned that it feels good to help others.", "{a} learned that it is good to be kind."],
}


def a_an(phrase):
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


class Character:
    def __init__(self, rng, kind=None, avoid=()):
        self.kind = kind or rng.choice(PEOPLE + ANIMALS if rng.random() < 0.5 else PEOPLE)
        if self.kind == "girl":
            self.female = True
        elif self.kind == "boy":
            self.female = False
        else:
            self.female = rng.random() < 0.5
        names = [n for n in (GIRLS if self.female else BOYS) if n not in avoid]
        self.name = rng.choice(names)
        self.adj = rng.choice(CHAR_ADJ)
        self.subj = "she" if self.female else "he"
        self.obj = "her" if self.female else "him"
        self.poss = "her" if self.female else "his"


def cap(s):
    return s[0].upper() + s[1:]


def story(rng):
    """One story: a few sentences, single paragraph, ASCII only, no newline."""
    hero = Character(rng)
    friend = Character(rng, avoid=(hero.name,))
    S = []
    # introduction
    intro = rng.randrange(4)
    who = a_an(f"{hero.adj} {hero.kind}")
    if intro == 0:
        S.append(f"Once upon a time, there was {who} named {hero.name}.")
    elif intro == 1:
        S.append(f"Once upon a time, in a small village, there lived {who} named {hero.name}.")
    elif intro == 2:
        S.append(f"There was once {who} named {hero.name}.")
    else:
        S.append(f"One sunny day, {who} named {hero.name} woke up early.")
    home = rng.choice(KINDS[hero.kind]).format(place=rng.choice(PLACES), poss=hero.poss)
    S.append(f"{cap(hero.subj)} {home}.")
    toy = rng.choice(list(TOYS))
    toy_adj = rng.choice(TOY_ADJ)
    verb = TOYS[toy]
    if rng.random() < 0.5:
        S.append(f"{cap(hero.subj)} had {a_an(toy_adj + ' ' + toy)}, and {hero.subj} loved to {verb} it every day.")
    else:
        S.append(f"{hero.name} loved {hero.poss} {toy_adj} {toy} very much.")

    plot = rng.choice(["lost", "find", "share", "storm", "help"])
    family = rng.choice(FAMILY)
    if plot == "lost":
        S.append(f"One day, {hero.name} could not find {hero.poss} {toy}.")
        S.append(f"{cap(hero.subj)} looked {rng.choice(['under the bed', 'behind the door', 'in the kitchen'])} "
                 f"and {rng.choice(['in the garden', 'under the table', 'in the yard'])}, but it was not there.")
        S.append(f"{hero.name} felt very sad and started to cry.")
        S.append(f"Then {hero.poss} friend {friend.name} the {friend.kind} came to play.")
        S.append(f"{friend.name} asked, \"Why are you sad, {hero.name}?\"")
        S.append(f"\"I lost my {toy_adj} {toy},\" said {hero.name}.")
        S.append(f"\"Let's look for it together,\" said {friend.name}.")
        p1, p2 = rng.sample(PLACES, 2)
        S.append(f"They looked in the {p1} and near the {p2}.")
        S.append(f"At last, {friend.name} found the {toy} {rng.choice(HIDING)}.")
        S.append(f"{hero.name} was so {rng.choice(FEELINGS_GOOD)} that {hero.subj} hugged {friend.name} "
                 f"and said, \"Thank you, {friend.name}!\"")
    elif plot == "find":
        place = rng.choice(PLACES)
        thing = rng.choice(FINDS)
        adj = rng.choice(FIND_ADJ)
        S.append(f"One day, {hero.name} went to the {place} with {hero.poss} {family}.")
        S.append(f"There, {hero.subj} saw {a_an(adj + ' ' + thing)} {rng.choice(HIDING)}.")
        S.append(f"\"Look, {cap(family)}! {cap(a_an(adj + ' ' + thing))}!\" {hero.subj} said.")
        S.append(f"{hero.poss.capitalize()} {family} smiled and said, \"You can keep it, but be careful with it.\"")
        S.append(f"{hero.name} put the {thing} in {hero.poss} pocket and took it home.")
        S.append(f"Later, {hero.subj} showed the {thing} to {hero.poss} friend {friend.name}.")
        S.append(f"{friend.name} said, \"Wow! It is so {adj}!\"")
        S.append(f"{hero.name} felt {rng.choice(FEELINGS_GOOD)}, and {hero.subj} let {friend.name} hold the {thing}.")
    elif plot == "share":
        food = rng.choice(list(FOODS))
        n = rng.randrange(2, 7)
        k = rng.randrange(1, n)
        form = lambda m: FOODS[food] if m != 1 else food
        S.append(f"One day, {hero.poss} {family} gave {hero.obj} {NUMBERS[n]} {form(n)}.")
        S.append(f"{hero.name} met {hero.poss} friend {friend.name}, who had no {FOODS[food]}.")
        S.append(f"{friend.name} looked at the {FOODS[food]} and felt sad.")
        S.append(f"{hero.name} thought for a moment.")
        S.append(f"Then {hero.subj} gave {NUMBERS[k]} {form(k)} to {friend.name}.")
        S.append(f"Now {hero.name} had {NUMBERS[n - k]} {form(n - k)}, and {friend.name} had {NUMBERS[k]}.")
        S.append(f"{friend.name} smiled and said, \"Thank you, {hero.name}! You are a good friend.\"")
        S.append(f"They ate the {FOODS[food]} together under a tree.")
    elif plot == "storm":
        S.append(f"One day, the sky became dark, and it started to rain.")
        S.append(f"{hero.name} heard a loud noise and was very scared.")
        S.append(f"{cap(hero.subj)} ran to {hero.poss} {family} and held {hero.poss} {toy} tight.")
        S.append(f"{hero.poss.capitalize()} {family} gave {hero.obj} a big hug and said, "
                 f"\"Do not be scared, {hero.name}. The rain will stop soon.\"")
        S.append(f"Soon the rain stopped, and the sun came out again.")
        S.append(f"{hero.name} looked out the window and saw a big rainbow in the sky.")
        S.append(f"{cap(hero.subj)} called {hero.poss} friend {friend.name}, and they went to play in the {rng.choice(PLACES)}.")
    else:  # help
        animal = rng.choice([a for a in ANIMALS if a != hero.kind])
        stuck = rng.choice(["stuck in a tall tree", "stuck in the mud", "lost in the woods", "caught in a bush"])
        S.append(f"One day, {hero.name} saw {a_an('little ' + animal)} {stuck}.")
        S.append(f"The {animal} was scared and could not get out.")
        S.append(f"{hero.name} wanted to help, but {hero.subj} was too small.")
        S.append(f"{cap(hero.subj)} ran to get {hero.poss} friend {friend.name}.")
        S.append(f"\"We have to help the {animal}!\" said {hero.name}.")
        S.append(f"{friend.name} found a long stick, and together they helped the {animal}.")
        S.append(f"The {animal} was free, and it said, \"Thank you, {hero.name} and {friend.name}!\"")
    # ending
    if rng.random() < 0.5:
        S.append(rng.choice(ENDINGS_FRIENDS).format(a=hero.name, b=friend.name))
    S.append(rng.choice(MORALS[plot]).format(a=hero.name, poss=hero.poss))
    return " ".join(S)


def make_stories(seed, n):
    rng = random.Random(seed)
    return [story(rng) for _ in range(n)]


# ---------------------------------------------------------------------------------------------------------------
# 2. Tokenizer: BPE in the llama2.c / SentencePiece conventions, encoded exactly as kvlab encodes
# ---------------------------------------------------------------------------------------------------------------

N_SPECIAL = 3  # <unk>, <s>, </s>
BOS, EOS = 1, 2
BYTE_OFFSET = 3  # byte b is token b + 3, piece "<0xNN>"
# Pre-tokens for BPE training: a run of letters or one other character, each with an optional leading space.
# Every merged piece matches PIECE_RE, so no vocabulary piece can span two pre-tokens; that is what makes the
# per-word encoder (encode_fast) identical to the whole-text one (encode_reference).
PRETOKEN_RE = re.compile(r" ?[A-Za-z]+| ?[^A-Za-z ]| ")
PIECE_RE = re.compile(r"^ ?[A-Za-z]+$|^ ?[^A-Za-z ]$|^ $")


class Tokenizer:
    def __init__(self, pieces, scores):
        assert len(pieces) == len(scores)
        self.pieces = pieces  # list of bytes
        self.scores = [float(np.float32(s)) for s in scores]  # exactly what tokenizer.bin stores
        self.ids = {}
        for i, p in enumerate(pieces):
            self.ids.setdefault(p, i)  # first id holding a piece, as kvlab
        self._word_cache = {}

    @property
    def n_vocab(self):
        return len(self.pieces)

    # --- the encoding algorithm of llama2.c's run.c / kvlab's Tokenizer::encode, written out plainly ---
    def _initial_symbols(self, data):
        """One id per UTF-8 code point found in the vocabulary, else one id per byte (byte + 3)."""
        out = []
        i = 0
        while i < len(data):
            j = i + 1
            while j < len(data) and j - i < 4 and (data[j] & 0xC0) == 0x80:
                j += 1
            point = data[i:j]
            if point in self.ids:
                out.append(self.ids[point])
            else:
                for b in point:
                    if b + BYTE_OFFSET >= self.n_vocab:
                        raise ValueError(f"byte 0x{b:02X} has no fallback token")
                    out.append(b + BYTE_OFFSET)
            i = j
        return out

    def _merge(self, work):
        """Repeatedly merge the adjacent pair whose concatenation is a piece with the highest score;
        leftmost pair on equal scores; stop when no adjacent concatenation is a piece."""
        while True:
            best_score, best_i, best_id = None, -1, -1
            for i in range(len(work) - 1):
                tid = self.ids.get(self.pieces[work[i]] + self.pieces[work[i + 1]])
                if tid is not None and (best_score is None or self.scores[tid] > best_score):
                    best_score, best_i, best_id = self.scores[tid], i, tid
            if best_i < 0:
                return work
            work[best_i:best_i + 2] = [best_id]

    def encode_reference(self, text, bos=True, eos=False):
        """The whole text at once, exactly as kvlab: dummy prefix space (non-empty text), code points or byte
        fallback, then the merge loop. Quadratic; used to check encode_fast."""
        data = (" " + text).encode("utf-8") if text else b""
        ids = self._merge(self._initial_symbols(data))
        return ([BOS] if bos else []) + ids + ([EOS] if eos else [])

    def encode_fast(self, text, bos=True, eos=False):
        """Same result as encode_reference (checked in main), per pre-token with a cache: merges never cross a
        pre-token boundary because no piece does, and merges in different pre-tokens do not interact."""
        padded = " " + text if text else ""
        ids = []
        for w in PRETOKEN_RE.findall(padded):
            got = self._word_cache.get(w)
            if got is None:
                got = self._merge(self._initial_symbols(w.encode("utf-8")))
                self._word_cache[w] = got
            ids.extend(got)
        assert "".join(PRETOKEN_RE.findall(padded)) == padded, "text outside the pre-token pattern"
        return ([BOS] if bos else []) + ids + ([EOS] if eos else [])

    def decode(self, ids, prev=-1):
        """Text of a token stream as llama2.c's run.c and kvlab print it, one token after the other: a BOS that
        opens the stream prints nothing; a piece right after BOS loses its leading space; "<0xNN>" pieces are
        the raw byte; a single control byte other than whitespace prints nothing (llama2.c's safe printing).
        `prev` is the token before ids[0] (-1: none)."""
        out = bytearray()
        for t in ids:
            p = self.pieces[t]
            if prev == -1 and t == BOS:
                p = b""
            elif re.fullmatch(rb"<0x[0-9A-Fa-f]{2}>", p):
                p = bytes([int(p[3:5], 16)])
            elif prev == BOS and p.startswith(b" "):
                p = p[1:]
            if len(p) == 1 and ((p[0] < 0x20 and p not in b"\t\n\v\f\r") or p[0] == 0x7F):
                p = b""
            out += p
            prev = t
        return out.decode("utf-8", errors="replace")

    def write(self, path):
        max_len = max(len(p) for p in self.pieces)
        with open(path, "wb") as f:
            f.write(struct.pack("<i", max_len))
            for p, s in zip(self.pieces, self.scores):
                f.write(struct.pack("<fi", s, len(p)))
                f.write(p)

    @staticmethod
    def read(path, n_vocab):
        with open(path, "rb") as f:
            data = f.read()
        (max_len,) = struct.unpack_from("<i", data, 0)
        off, pieces, scores = 4, [], []
        for _ in range(n_vocab):
            s, n = struct.unpack_from("<fi", data, off)
            off += 8
            assert 0 < n <= max_len
            pieces.append(data[off:off + n])
            scores.append(s)
            off += n
        assert off == len(data)
        return Tokenizer(pieces, scores)


def train_tokenizer(texts, vocab_size):
    """BPE whose every step tokenizes the words with the score-greedy encoder above, so the learnt merges and
    their scores reproduce themselves under kvlab's encode. Returns (Tokenizer, n_merges, n_chars)."""
    word_counts = {}
    for t in texts:
        for w in PRETOKEN_RE.findall(" " + t):
            word_counts[w] = word_counts.get(w, 0) + 1
    char_counts = {}
    for w, c in word_counts.items():
        for ch in w:
            char_counts[ch] = char_counts.get(ch, 0) + c
    assert all(ord(ch) < 128 for ch in char_counts), "the grammar is ASCII-only"
    chars = sorted(char_counts, key=lambda ch: (-char_counts[ch], ch))
    # llama2.c's tokenizer.bin spells BOS and EOS "\n<s>\n" and "\n</s>\n" (its tokenizer.py), so that a story
    # boundary the model generates prints on its own line; no text can encode to them
    base = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    n_merges = vocab_size - len(base) - len(chars)
    assert n_merges > 0
    merges = []

    def build(merges):
        pieces = base + merges + [ch.encode() for ch in chars]
        # specials and bytes 0, merge i scores -i (earlier merges win), characters below every merge
        scores = [0.0] * len(base) + [-float(i) for i in range(len(merges))] + \
                 [-float(len(merges) + i) for i in range(len(chars))]
        return Tokenizer(pieces, scores)

    tok = build(merges)
    for _ in range(n_merges):
        pair_counts = {}
        for w, c in word_counts.items():
            ids = tok._merge(tok._initial_symbols(w.encode()))
            for a, b in zip(ids, ids[1:]):
                pair_counts[(a, b)] = pair_counts.get((a, b), 0) + c
        if not pair_counts:
            break
        (a, b), _ = min(pair_counts.items(),
                        key=lambda kv: (-kv[1], tok.pieces[kv[0][0]] + tok.pieces[kv[0][1]], kv[0]))
        new = tok.pieces[a] + tok.pieces[b]
        assert new not in tok.ids and PIECE_RE.match(new.decode())
        merges.append(new)
        tok = build(merges)
    # pad with unused characters if the corpus ran out of pairs (does not happen with the default corpus)
    assert tok.n_vocab == vocab_size, (tok.n_vocab, vocab_size)
    return tok, len(merges), len(chars)


# ---------------------------------------------------------------------------------------------------------------
# 3. Models
# ---------------------------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """Zhang & Sennrich 2019: x / sqrt(mean(x^2) + eps) * g."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim, n_pos, theta=10000.0):
    """RoFormer (Su et al. 2021): pair i of a head turns by angle pos * theta^(-2i/D)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(n_pos, dtype=torch.float32), inv_freq)  # (T, D/2)
    return torch.cos(angles), torch.sin(angles)


def apply_rope_neighbours(x, cos, sin):
    """x: (B, T, H, D); rotates the neighbouring pairs (x[2i], x[2i+1]) as llama2.c does."""
    B, T, H, D = x.shape
    xp = x.reshape(B, T, H, D // 2, 2)
    a, b = xp[..., 0], xp[..., 1]
    c = cos[:T].view(1, T, 1, D // 2)
    s = sin[:T].view(1, T, 1, D // 2)
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).reshape(B, T, H, D)


def causal_attention(q, k, v):
    """q: (B, H, T, D), k/v: (B, H, T, D). softmax(q k^T / sqrt(D) + causal mask) v (Vaswani et al. 2017)."""
    T, D = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = att.masked_fill(mask, float("-inf"))
    return F.softmax(att, dim=-1) @ v


class LlamaBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, D = c["dim"], c["dim"] // c["n_heads"]
        self.n_heads, self.n_kv_heads, self.head_dim = c["n_heads"], c["n_kv_heads"], D
        self.attention_norm = RMSNorm(d, c["norm_eps"])
        self.wq = nn.Linear(d, c["n_heads"] * D, bias=False)
        self.wk = nn.Linear(d, c["n_kv_heads"] * D, bias=False)
        self.wv = nn.Linear(d, c["n_kv_heads"] * D, bias=False)
        self.wo = nn.Linear(c["n_heads"] * D, d, bias=False)
        self.ffn_norm = RMSNorm(d, c["norm_eps"])
        self.w1 = nn.Linear(d, c["hidden_dim"], bias=False)
        self.w2 = nn.Linear(c["hidden_dim"], d, bias=False)
        self.w3 = nn.Linear(d, c["hidden_dim"], bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(h).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(h).view(B, T, self.n_kv_heads, self.head_dim)
        q, k = apply_rope_neighbours(q, cos, sin), apply_rope_neighbours(k, cos, sin)
        # GQA (Ainslie et al. 2023): query head h reads KV head h // (n_heads / n_kv_heads)
        rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        o = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.wo(o.transpose(1, 2).reshape(B, T, -1))
        h = self.ffn_norm(x)
        # SwiGLU (Shazeer 2020): w2(silu(w1 x) * w3 x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_embeddings = nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = nn.ModuleList(LlamaBlock(c) for _ in range(c["n_layers"]))
        self.norm = RMSNorm(c["dim"], c["norm_eps"])
        cos, sin = rope_tables(c["dim"] // c["n_heads"], c["seq_len"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(_init)
        for name, p in self.named_parameters():
            if name.endswith("wo.weight") or name.endswith("w2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c["n_layers"]))

    def forward(self, idx):
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.norm(x) @ self.tok_embeddings.weight.t()  # tied classifier


class MLABlock(nn.Module):
    """Multi-head latent attention, DeepSeek-V2 (arXiv 2405.04434) section 2.1, written from its equations, with
    a SwiGLU MLP. Per token: the latent c_KV = W_DKV h (eq. 9), RMS-normed (the paper's section 3.1.2: "additional
    RMSNorm layers after the compressed latent vectors"); per-head keys and values decompressed from it,
    k_C = W_UK c_KV (eq. 10), v_C = W_UV c_KV (eq. 11); the decoupled RoPE key k_R = RoPE(W_KR h), one for all
    heads (eq. 17); queries [q_C; q_R] with q_C = W_UQ h, q_R = RoPE(W_QR h) (eqs. 12, 16 with no query
    compression: q_lora_rank absent, c_Q = h); softmax(q k^T / sqrt(d_h + d_h^R)) v (eq. 19); u = W_O o (eq. 19).
    The cache holds c_KV and k_R per token and nothing else. Weight names as Hugging Face's deepseek_v2 files:
    kv_a_proj_with_mqa stacks [W_DKV; W_KR], kv_b_proj stacks [W_UK; W_UV] per head, q_proj stacks [W_UQ; W_QR]
    per head. RoPE turns neighbouring pairs, as the Llama export."""

    def __init__(self, c):
        super().__init__()
        d, H = c["hidden_size"], c["num_attention_heads"]
        self.H, self.r = H, c["kv_lora_rank"]
        self.nope, self.rope, self.dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.input_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.q_proj = nn.Linear(d, H * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.r + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.r, c["rms_norm_eps"])
        self.kv_b_proj = nn.Linear(self.r, H * (self.nope + self.dv), bias=False)
        self.o_proj = nn.Linear(H * self.dv, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.gate_proj = nn.Linear(d, c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(d, c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        H = self.H
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, H, self.nope + self.rope)
        q_c, q_r = q[..., :self.nope], apply_rope_neighbours(q[..., self.nope:], cos, sin)
        a = self.kv_a_proj_with_mqa(h)
        c_kv = self.kv_a_layernorm(a[..., :self.r])                                           # (B, T, r): cached
        k_r = apply_rope_neighbours(a[..., self.r:].view(B, T, 1, self.rope), cos, sin)       # (B, T, 1, R): cached
        kv = self.kv_b_proj(c_kv).view(B, T, H, self.nope + self.dv)
        k_c, v = kv[..., :self.nope], kv[..., self.nope:]
        q = torch.cat((q_c, q_r), dim=-1)
        k = torch.cat((k_c, k_r.expand(B, T, H, self.rope)), dim=-1)
        o = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # scale 1/sqrt(nope + rope)
        x = x + self.o_proj(o.transpose(1, 2).reshape(B, T, H * self.dv))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class MLA(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(MLABlock(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        cos, sin = rope_tables(c["qk_rope_head_dim"], c["max_position_embeddings"], c["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(_init)
        for name, p in self.named_parameters():
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c["num_hidden_layers"]))

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.norm(x) @ self.embed_tokens.weight.t()  # tied classifier


def gelu_tanh(x):
    """Hendrycks & Gimpel 2016, tanh approximation, as GPT-2 ("gelu_new")."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["n_embd"]
        self.n_head = c["n_head"]
        self.ln_1 = nn.LayerNorm(d, eps=c["layer_norm_epsilon"])
        self.c_attn = nn.Linear(d, 3 * d)  # q, k, v outputs in that order, heads contiguous in each
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=c["layer_norm_epsilon"])
        self.c_fc = nn.Linear(d, c["n_inner"])
        self.mlp_proj = nn.Linear(c["n_inner"], d)

    def forward(self, x):
        B, T, d = x.shape
        H = self.n_head
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
        o = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, d)
        x = x + self.c_proj(o)
        return x + self.mlp_proj(gelu_tanh(self.c_fc(self.ln_2(x))))


class GPT2(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
        self.h = nn.ModuleList(GPT2Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])
        self.apply(_init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c["n_layer"]))

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied classifier


def _init(m):
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, 0.0, 0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Embedding):
        nn.init.normal_(m.weight, 0.0, 0.02)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------------------------
# 4. Export and import (the import rebuilds the PyTorch model from the files, so the reference data is computed
#    from exactly what kvlab reads)
# ---------------------------------------------------------------------------------------------------------------

def f32_bytes(t):
    return t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()


def export_llama2c_v0(model, path):
    """llama2.c legacy (v0) file: 7 int32 header, then fp32 tensors in run.c's order, tied classifier (positive
    vocab_size), the two legacy RoPE tables included."""
    c = model.c
    hdr = struct.pack("<7i", c["dim"], c["hidden_dim"], c["n_layers"], c["n_heads"], c["n_kv_heads"],
                      c["vocab_size"], c["seq_len"])
    L = model.layers
    parts = [hdr, f32_bytes(model.tok_embeddings.weight)]
    for name in ["attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3"]:
        for layer in L:
            parts.append(f32_bytes(getattr(layer, name).weight))
    parts.append(f32_bytes(model.norm.weight))
    parts.append(f32_bytes(model.cos))  # freq_cis_real (seq_len, head_dim/2)
    parts.append(f32_bytes(model.sin))  # freq_cis_imag
    with open(path, "wb") as f:
        for p in parts:
            f.write(p)


def import_llama2c_v0(path, norm_eps=1e-5):
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", data, 0)
    assert vocab > 0, "this script writes tied files only"
    c = dict(dim=dim, hidden_dim=hidden, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, vocab_size=vocab,
             seq_len=seq_len, norm_eps=norm_eps)
    torch.manual_seed(0)
    m = Llama(c)
    off = 28
    arr = np.frombuffer(data, dtype="<f4", offset=off)
    pos = 0

    def take(shape):
        nonlocal pos
        n = int(np.prod(shape))
        t = torch.from_numpy(arr[pos:pos + n].copy()).view(*shape)
        pos += n
        return t

    D = dim // n_heads
    with torch.no_grad():
        m.tok_embeddings.weight.copy_(take((vocab, dim)))
        shapes = {"attention_norm": (dim,), "wq": (n_heads * D, dim), "wk": (n_kv * D, dim), "wv": (n_kv * D, dim),
                  "wo": (dim, n_heads * D), "ffn_norm": (dim,), "w1": (hidden, dim), "w2": (dim, hidden),
                  "w3": (hidden, dim)}
        for name, shape in shapes.items():
            for layer in m.layers:
                getattr(layer, name).weight.copy_(take(shape))
        m.norm.weight.copy_(take((dim,)))
        take((seq_len, D // 2))
        take((seq_len, D // 2))
    assert pos == arr.size, "file longer than the header implies"
    return m.eval()


def write_safetensors(path, tensors):
    """safetensors by hand: u64 little-endian header length, JSON header, raw little-endian data."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors:
        b = f32_bytes(t)
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32"
        a, b = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[8 + n + a:8 + n + b], dtype="<f4").copy()).view(*e["shape"])
    return out


def gpt2_config_json(c):
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c["vocab_size"],
        "n_positions": c["n_positions"],
        "n_ctx": c["n_positions"],
        "n_embd": c["n_embd"],
        "n_layer": c["n_layer"],
        "n_head": c["n_head"],
        "n_inner": c["n_inner"],
        "activation_function": "gelu_new",
        "layer_norm_epsilon": c["layer_norm_epsilon"],
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "torch_dtype": "float32",
        "_kvlab": {"display_name": "tiny-gpt2", "source": "scripts/train-tiny.py"},
    }


def export_gpt2_hf(model, directory):
    """Hugging Face GPT-2 directory; Conv1D weights are stored (in, out), i.e. transposed nn.Linear weights."""
    os.makedirs(directory, exist_ok=True)
    c = model.c
    t = [("wte.weight", model.wte.weight), ("wpe.weight", model.wpe.weight)]
    for i, b in enumerate(model.h):
        p = f"h.{i}."
        t += [(p + "ln_1.weight", b.ln_1.weight), (p + "ln_1.bias", b.ln_1.bias),
              (p + "attn.c_attn.weight", b.c_attn.weight.t()), (p + "attn.c_attn.bias", b.c_attn.bias),
              (p + "attn.c_proj.weight", b.c_proj.weight.t()), (p + "attn.c_proj.bias", b.c_proj.bias),
              (p + "ln_2.weight", b.ln_2.weight), (p + "ln_2.bias", b.ln_2.bias),
              (p + "mlp.c_fc.weight", b.c_fc.weight.t()), (p + "mlp.c_fc.bias", b.c_fc.bias),
              (p + "mlp.c_proj.weight", b.mlp_proj.weight.t()), (p + "mlp.c_proj.bias", b.mlp_proj.bias)]
    t += [("ln_f.weight", model.ln_f.weight), ("ln_f.bias", model.ln_f.bias)]
    write_safetensors(os.path.join(directory, "model.safetensors"), t)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(gpt2_config_json(c), f, indent=2)
        f.write("\n")


def import_gpt2_hf(directory):
    with open(os.path.join(directory, "config.json")) as f:
        j = json.load(f)
    c = dict(vocab_size=j["vocab_size"], n_positions=j["n_positions"], n_embd=j["n_embd"], n_layer=j["n_layer"],
             n_head=j["n_head"], n_inner=j["n_inner"], layer_norm_epsilon=j["layer_norm_epsilon"])
    torch.manual_seed(0)
    m = GPT2(c)
    st = read_safetensors(os.path.join(directory, "model.safetensors"))
    with torch.no_grad():
        m.wte.weight.copy_(st.pop("wte.weight"))
        m.wpe.weight.copy_(st.pop("wpe.weight"))
        for i, b in enumerate(m.h):
            p = f"h.{i}."
            for mod, name in [(b.ln_1, "ln_1"), (b.ln_2, "ln_2")]:
                mod.weight.copy_(st.pop(p + name + ".weight"))
                mod.bias.copy_(st.pop(p + name + ".bias"))
            for mod, name in [(b.c_attn, "attn.c_attn"), (b.c_proj, "attn.c_proj"), (b.c_fc, "mlp.c_fc"),
                              (b.mlp_proj, "mlp.c_proj")]:
                mod.weight.copy_(st.pop(p + name + ".weight").t())
                mod.bias.copy_(st.pop(p + name + ".bias"))
        m.ln_f.weight.copy_(st.pop("ln_f.weight"))
        m.ln_f.bias.copy_(st.pop("ln_f.bias"))
    assert not st, f"unexpected tensors {sorted(st)}"
    return m.eval()


def mla_config_json(c):
    """A Hugging Face deepseek_v2 config.json: the MLA fields kvcalc reads, dense layers only (no experts)."""
    return {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": c["vocab_size"],
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_attention_heads"],
        "kv_lora_rank": c["kv_lora_rank"],
        "q_lora_rank": None,
        "qk_nope_head_dim": c["qk_nope_head_dim"],
        "qk_rope_head_dim": c["qk_rope_head_dim"],
        "v_head_dim": c["v_head_dim"],
        "n_routed_experts": None,
        "first_k_dense_replace": c["num_hidden_layers"],
        "max_position_embeddings": c["max_position_embeddings"],
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_theta": c["rope_theta"],
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "torch_dtype": "float32",
        "_kvlab": {"display_name": "tiny-mla", "source": "scripts/train-tiny.py", "rope_pairing": "neighbours"},
    }


MLA_TENSORS = ["input_layernorm", "self_attn.q_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.kv_a_layernorm",
               "self_attn.kv_b_proj", "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
               "mlp.down_proj"]


def _mla_module(block, name):
    return getattr(block, name.split(".")[-1])


def export_mla_hf(model, directory):
    os.makedirs(directory, exist_ok=True)
    t = [("model.embed_tokens.weight", model.embed_tokens.weight)]
    for i, b in enumerate(model.layers):
        t += [(f"model.layers.{i}.{n}.weight", _mla_module(b, n).weight) for n in MLA_TENSORS]
    t += [("model.norm.weight", model.norm.weight)]
    write_safetensors(os.path.join(directory, "model.safetensors"), t)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(mla_config_json(model.c), f, indent=2)
        f.write("\n")


def import_mla_hf(directory):
    with open(os.path.join(directory, "config.json")) as f:
        j = json.load(f)
    c = {k: j[k] for k in MLA_CFG}
    torch.manual_seed(0)
    m = MLA(c)
    st = read_safetensors(os.path.join(directory, "model.safetensors"))
    with torch.no_grad():
        m.embed_tokens.weight.copy_(st.pop("model.embed_tokens.weight"))
        for i, b in enumerate(m.layers):
            for n in MLA_TENSORS:
                _mla_module(b, n).weight.copy_(st.pop(f"model.layers.{i}.{n}.weight"))
        m.norm.weight.copy_(st.pop("model.norm.weight"))
    assert not st, f"unexpected tensors {sorted(st)}"
    return m.eval()


# ---------------------------------------------------------------------------------------------------------------
# 5. Training and evaluation
# ---------------------------------------------------------------------------------------------------------------

def token_stream(tok, stories):
    """llama2.c's pretokenisation: every story encoded with BOS, the stories concatenated."""
    out = []
    for s in stories:
        out.extend(tok.encode_fast(s, bos=True))
    return torch.tensor(out, dtype=torch.long)


def heldout_windows(stream, ctx, max_windows):
    n = min(max_windows, (len(stream) - 1) // ctx)
    x = torch.stack([stream[i * ctx:i * ctx + ctx] for i in range(n)])
    y = torch.stack([stream[i * ctx + 1:i * ctx + ctx + 1] for i in range(n)])
    return x, y


@torch.no_grad()
def eval_loss(model, x, y, batch=8):
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(x), batch):
        logits = model(x[i:i + batch])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i:i + batch].reshape(-1),
                                 reduction="sum").item()
        count += y[i:i + batch].numel()
    model.train()
    return total / count


def train(model, name, train_stream, val_x, val_y, steps, batch, ctx, lr, seed, log_every, eval_every, log):
    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    warmup = max(1, steps // 20)
    curve, val_curve = [], []
    t0 = time.time()
    running, running_n = 0.0, 0
    model.train()
    for step in range(1, steps + 1):
        lr_now = lr * step / warmup if step <= warmup else \
            lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup))))
        for g in opt.param_groups:
            g["lr"] = lr_now
        starts = torch.randint(0, len(train_stream) - ctx - 1, (batch,), generator=gen)
        x = torch.stack([train_stream[s:s + ctx] for s in starts.tolist()])
        y = torch.stack([train_stream[s + 1:s + ctx + 1] for s in starts.tolist()])
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running += loss.item()
        running_n += 1
        if step % log_every == 0 or step == steps:
            curve.append({"step": step, "train_loss": round(running / running_n, 4), "lr": round(lr_now, 6),
                          "elapsed_s": round(time.time() - t0, 1)})
            running, running_n = 0.0, 0
        if step % eval_every == 0 or step == steps or step == 1:
            v = eval_loss(model, val_x, val_y)
            val_curve.append({"step": step, "heldout_loss": round(v, 4)})
            log(f"{name}: step {step}/{steps} train {curve[-1]['train_loss'] if curve else loss.item():.4f} "
                f"held-out {v:.4f} lr {lr_now:.2e} {time.time() - t0:.0f}s")
    wall = time.time() - t0
    return model.eval(), curve, val_curve, wall


@torch.no_grad()
def greedy(model, ids, n_new, ctx):
    seq = list(ids)
    margins = []
    for _ in range(n_new):
        logits = model(torch.tensor([seq[-ctx:]]))[0, -1]
        top2 = torch.topk(logits, 2)
        margins.append(float(top2.values[0] - top2.values[1]))
        seq.append(int(torch.argmax(logits)))  # first index of the maximum
    return seq[len(ids):], margins


BEAM_WIDTH, BEAM_NEW_TOKENS = 4, 8


@torch.no_grad()
def beam_search(model, ids, width, n_new, ctx):
    """kvlab serve --beam-width's definition (src/serve/outputs.hpp), written from it: a beam's score is the sum of
    log softmax(logits)[token] over its generated tokens (float64 log-softmax of the float32 logits); each step
    every beam is extended by every token and the `width` best candidates are kept (ties: the better-ranked beam,
    then the lower token id); no EOS, no length penalty (all beams have the same length). Each beam's logits are
    recomputed from scratch over its whole sequence (no KV cache). Returns the beams best first, and the smallest
    gap over the steps between the last kept candidate and the first dropped one."""
    beams = [(0.0, [])]  # (score, generated), best first
    min_gap = math.inf
    for _ in range(n_new):
        cands = []
        for rank, (score, gen) in enumerate(beams):
            logits = model(torch.tensor([(list(ids) + gen)[-ctx:]]))[0, -1]
            logp = F.log_softmax(logits.double(), dim=-1).tolist()
            cands += [(score + lp, rank, tok) for tok, lp in enumerate(logp)]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        min_gap = min(min_gap, cands[width - 1][0] - cands[width][0])
        beams = [(c[0], beams[c[1]][1] + [c[2]]) for c in cands[:width]]
    return [{"ids": gen, "score": score} for score, gen in beams], min_gap


@torch.no_grad()
def sequence_nll(model, ids):
    """Teacher-forced: logits at positions 0..N-2 predict tokens 1..N-1; natural log, float64 accumulation."""
    logits = model(torch.tensor([ids]))[0].double()
    logp = F.log_softmax(logits[:-1], dim=-1)
    tgt = torch.tensor(ids[1:])
    nll = -logp[torch.arange(len(tgt)), tgt]
    return float(nll.sum()), len(tgt), [float(v) for v in nll]


def fmt_f32(v):
    """Shortest decimal that reads back as the same float32 (at most 9 significant digits)."""
    return np.format_float_positional(np.float32(v), unique=True, trim="0") if abs(v) >= 1e-4 or v == 0 else \
        np.format_float_scientific(np.float32(v), unique=True, trim="0")


# ---------------------------------------------------------------------------------------------------------------

LLAMA_CFG = dict(dim=192, hidden_dim=320, n_layers=4, n_heads=6, n_kv_heads=2, vocab_size=512, seq_len=256,
                 norm_eps=1e-5)
GPT2_CFG = dict(vocab_size=512, n_positions=256, n_embd=128, n_layer=5, n_head=4, n_inner=512,
                layer_norm_epsilon=1e-5)
# Multi-head latent attention (DeepSeek-V2): a 32-wide latent + a 16-wide RoPE key cached per token per layer, 48
# values, where 4 MHA heads of q/k width 48 and v width 32 would cache 4 x (48 + 32) = 320
MLA_CFG = dict(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
               kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, max_position_embeddings=256,
               rms_norm_eps=1e-5, rope_theta=10000.0)
PROMPTS = ["Once upon a time", "One day, Lily went to the park with her mom.", "Tom and his friend Max"]


def check_kvlab(kvlab, out, threads):
    """Runs `kvlab simulate` on both exports for every prompt of reference.json (greedy, --mode both, so kvlab
    also compares its cached and uncached logits) and compares its tokens, read from a --trace JSONL file, with
    the PyTorch greedy continuation. Returns the number of mismatching runs."""
    import subprocess
    import tempfile
    with open(os.path.join(out, "reference.json")) as f:
        ref = json.load(f)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, m in ref["models"].items():
            for pr in m["prompts"]:
                n = len(pr["greedy_ids"])
                trace = os.path.join(tmp, "trace.jsonl")
                cmd = [kvlab, "simulate", "--checkpoint", os.path.join(out, m["checkpoint"]), "--tokenizer",
                       os.path.join(out, ref["tokenizer"]), "--prompt", pr["text"], "-n", str(n), "--mode", "both",
                       "--threads", str(threads), "--format", "json", "--trace", trace]
                run = subprocess.run(cmd, capture_output=True, text=True)
                rows = [json.loads(line) for line in open(trace).read().splitlines()[1:]] if run.returncode == 0 \
                    else []
                got = [r["token"] for r in sorted((r for r in rows if r.get("mode") == "cached"),
                                                  key=lambda r: r["step"])]
                # the same run from the reference's prompt ids: equal tokens again means equal prompt encodings
                cmd_ids = cmd[:cmd.index("--prompt")] + ["--prompt-ids", ",".join(map(str, pr["ids"]))] + \
                    cmd[cmd.index("--prompt") + 2:]
                run_ids = subprocess.run(cmd_ids, capture_output=True, text=True)
                rows_ids = [json.loads(line) for line in open(trace).read().splitlines()[1:]] \
                    if run_ids.returncode == 0 else []
                got_ids = [r["token"] for r in sorted((r for r in rows_ids if r.get("mode") == "cached"),
                                                      key=lambda r: r["step"])]
                text_ok = run.stderr.rstrip("\n") == pr["greedy_text"]
                ok = run.returncode == 0 and got == pr["greedy_ids"] and got_ids == got and text_ok
                bad += not ok
                print(f"{'OK  ' if ok else 'FAIL'} {name} {pr['text']!r}: kvlab rc {run.returncode}, "
                      f"{sum(a == b for a, b in zip(got, pr['greedy_ids']))}/{n} tokens equal; from --prompt-ids "
                      f"rc {run_ids.returncode}, {sum(a == b for a, b in zip(got_ids, pr['greedy_ids']))}/{n} equal; "
                      f"printed text {'equal' if text_ok else 'DIFFERENT'}")
                print("     $ " + " ".join(cmd[:1] + [repr(c) if " " in c else c for c in cmd[1:]]))
                print("     kvlab text: " + repr(run.stderr.rstrip("\n")))
                if not ok:
                    print("     kvlab ids:   ", got)
                    print("     pytorch ids: ", pr["greedy_ids"])
                    print("     stderr/stdout tail:", run.stderr[-600:], run.stdout[-300:])
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--threads", type=int, default=1, help="torch/BLAS threads (results depend on it; default 1)")
    ap.add_argument("--train-stories", type=int, default=20000)
    ap.add_argument("--val-stories", type=int, default=300)
    ap.add_argument("--llama-steps", type=int, default=480)
    ap.add_argument("--gpt2-steps", type=int, default=520)
    ap.add_argument("--mla-steps", type=int, default=400)
    ap.add_argument("--models", default="llama,gpt2,mla",
                    help="which models to train (comma-separated from llama, gpt2, mla); the others' files are kept as "
                         "they are, and the tokenizer is read from --out unless llama and gpt2 are both trained")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--eval-windows", type=int, default=40, help="validation windows of 256 tokens scored during training")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--corpus-dir", default=None, help="also write the generated train/val corpus here")
    ap.add_argument("--reference-only", action="store_true",
                    help="skip training: rebuild reference.json from the exported files in --out")
    ap.add_argument("--bench", type=int, default=0, help="time this many training steps of each model and exit")
    ap.add_argument("--check-kvlab", metavar="KVLAB", default=None,
                    help="only compare KVLAB's greedy tokens with reference.json (e.g. build/release/kvlab)")
    args = ap.parse_args()
    if args.check_kvlab:
        sys.exit(1 if check_kvlab(os.path.abspath(args.check_kvlab), os.path.abspath(args.out), args.threads) else 0)

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    T_START = time.time()
    torch.ones(64, 64) @ torch.ones(64, 64)  # load the BLAS library so that it shows in the maps
    blas = sorted({line.split()[-1] for line in open("/proc/self/maps")
                   if re.search(r"lib(open)?blas|libblis|libmkl", line)})
    log = lambda msg: print(f"[{time.time() - T_START:7.1f}s] {msg}", flush=True)

    # ---- corpus ----
    train_stories = make_stories(args.seed, args.train_stories)
    val_stories = make_stories(args.seed + 1, args.val_stories)
    heldout_candidates = make_stories(args.seed + 2, 50)
    log(f"torch {torch.__version__}, {args.threads} thread(s), BLAS {blas}")
    log(f"corpus: {len(train_stories)} train stories ({sum(map(len, train_stories)) / 1e6:.2f} MB), "
        f"{len(val_stories)} validation stories")
    if args.corpus_dir:
        os.makedirs(args.corpus_dir, exist_ok=True)
        for name, ss in [("train.txt", train_stories), ("val.txt", val_stories)]:
            with open(os.path.join(args.corpus_dir, name), "w") as f:
                f.write("\n".join(ss) + "\n")

    # ---- tokenizer ----
    tok_path = os.path.join(out, "tokenizer.bin")
    wanted = set(args.models.split(","))
    assert wanted <= {"llama", "gpt2", "mla"}, f"--models {args.models}: expected names from llama, gpt2, mla"
    keep_tokenizer = args.reference_only or not {"llama", "gpt2"} <= wanted
    if keep_tokenizer:
        tok = Tokenizer.read(tok_path, 512)
    else:
        tok, n_merges, n_chars = train_tokenizer(train_stories[:2000], 512)
        tok.write(tok_path)
        log(f"tokenizer: {n_merges} merges, {n_chars} characters, {tok.n_vocab} tokens")
        tok2 = Tokenizer.read(tok_path, 512)
        assert tok2.pieces == tok.pieces and tok2.scores == tok.scores
    # held-out text: the longest of 50 fresh stories (seed + 2) that fits one 256-token window with its BOS
    heldout = max((c for c in heldout_candidates if len(tok.encode_fast(c)) <= 256), key=len)
    # the fast encoder must equal the kvlab-identical one
    for s in PROMPTS + [heldout] + val_stories[:20] + train_stories[:20]:
        assert tok.encode_fast(s) == tok.encode_reference(s), s
    heldout_ids = tok.encode_reference(heldout, bos=True)
    assert len(heldout_ids) <= 256, len(heldout_ids)
    if not keep_tokenizer:
        with open(os.path.join(out, "heldout.txt"), "w") as f:
            f.write(heldout)  # no trailing newline: the file's bytes are the text

    ctx = 256
    train_stream = token_stream(tok, train_stories)
    val_stream = token_stream(tok, val_stories)
    val_x, val_y = heldout_windows(val_stream, ctx, args.eval_windows)
    log(f"tokens: train {len(train_stream)}, validation {len(val_stream)} ({len(val_x)} windows of {ctx} scored), "
        f"held-out story {len(heldout_ids)} with BOS; {sum(map(len, train_stories)) / len(train_stream):.2f} bytes/token")

    llama_dir = os.path.join(out, "tiny-llama")
    gpt2_dir = os.path.join(out, "tiny-gpt2")
    mla_dir = os.path.join(out, "tiny-mla")
    os.makedirs(llama_dir, exist_ok=True)
    llama_path = os.path.join(llama_dir, "model.bin")
    train_log = {}
    if not args.reference_only:
        for key, name, cls, cfg, steps, seed in [("llama", "tiny-llama", Llama, LLAMA_CFG, args.llama_steps, args.seed + 100),
                                                 ("gpt2", "tiny-gpt2", GPT2, GPT2_CFG, args.gpt2_steps, args.seed + 200),
                                                 ("mla", "tiny-mla", MLA, MLA_CFG, args.mla_steps, args.seed + 300)]:
            if key not in wanted:
                continue
            torch.manual_seed(seed)
            model = cls(cfg)
            log(f"{name}: {n_params(model)} parameters")
            if args.bench:
                t0 = time.time()
                train(model, name, train_stream, val_x, val_y, args.bench, args.batch, ctx, args.lr, seed, 10**9,
                      10**9, log)
                log(f"{name}: {(time.time() - t0) / args.bench:.3f} s/step")
                continue
            model, curve, val_curve, wall = train(model, name, train_stream, val_x, val_y, steps, args.batch, ctx,
                                                  args.lr, seed, max(1, steps // 40), max(1, steps // 10), log)
            if cls is Llama:
                export_llama2c_v0(model, llama_path)
                back = import_llama2c_v0(llama_path)
            elif cls is MLA:
                export_mla_hf(model, mla_dir)
                back = import_mla_hf(mla_dir)
            else:
                export_gpt2_hf(model, gpt2_dir)
                back = import_gpt2_hf(gpt2_dir)
            probe = torch.tensor([heldout_ids])
            assert torch.equal(model(probe), back(probe)), f"{name}: export does not round-trip"
            s, n, _ = sequence_nll(model, heldout_ids)
            train_log[name] = {"parameters": n_params(model), "config": cfg, "steps": steps, "batch": args.batch,
                               "context": ctx, "tokens_seen": steps * args.batch * ctx, "lr_max": args.lr,
                               "train_wall_s": round(wall, 1), "train_curve": curve, "heldout_curve": val_curve,
                               "final_validation_loss": val_curve[-1]["heldout_loss"],
                               "heldout_txt_mean_nll": s / n}
            log(f"{name}: trained in {wall:.0f}s; heldout.txt mean NLL {s / n:.4f} (ppl {math.exp(s / n):.3f})")
        if args.bench:
            return
        train_log["corpus"] = {"seed": args.seed, "train_stories": len(train_stories),
                               "train_bytes": sum(map(len, train_stories)) + len(train_stories),
                               "train_tokens": len(train_stream), "validation_stories": len(val_stories),
                               "validation_tokens": len(val_stream), "validation_windows": len(val_x)}
        train_log["threads"] = args.threads
        train_log["blas"] = blas
        train_log["torch"] = torch.__version__
        train_log["total_wall_s"] = round(time.time() - T_START, 1)
        log_path = os.path.join(out, "train-log.json")
        if not {"llama", "gpt2"} <= wanted and os.path.exists(log_path):  # keep the other models' entries
            with open(log_path) as f:
                old = json.load(f)
            old.update({k: v for k, v in train_log.items() if k.startswith("tiny-")})
            train_log = old
        with open(log_path, "w") as f:
            json.dump(train_log, f, indent=1)
            f.write("\n")

    # ---- reference data, from the models read back from the exported files ----
    models = [("tiny-llama", "tiny-llama/model.bin", "llama2.c v0", import_llama2c_v0(llama_path)),
              ("tiny-gpt2", "tiny-gpt2", "huggingface gpt2", import_gpt2_hf(gpt2_dir))]
    if os.path.exists(os.path.join(mla_dir, "config.json")):
        models.append(("tiny-mla", "tiny-mla", "huggingface deepseek_v2 (MLA)", import_mla_hf(mla_dir)))
    ref = {
        "description": "PyTorch (fp32, eval mode) reference outputs of the models in this directory, written by "
                       "scripts/train-tiny.py from the exported files themselves",
        "tokenizer": "tokenizer.bin",
        "tokenizer_sha256": hashlib.sha256(open(tok_path, "rb").read()).hexdigest(),
        "encoding": "kvlab/llama2.c encode: BOS (id 1), dummy leading space, one token per UTF-8 code point in the "
                    "vocabulary else byte fallback (byte + 3), then repeatedly merge the adjacent pair whose "
                    "concatenation is a piece with the highest score (leftmost on ties)",
        "logits_note": "logits[p] are the next-token logits after feeding ids[0..p] (positions 0-based, the BOS at "
                       "position 0), all vocab_size entries, float32 values printed as the shortest decimal that "
                       "reads back as the same float32",
        "greedy_note": "greedy = argmax of the logits (first index on ties), 64 tokens after the prompt, each step "
                       "recomputed from scratch over the whole sequence (no KV cache); min_top2_margin is the "
                       "smallest top1-top2 logit gap over those steps",
        "beam_note": f"beam_search: kvlab serve --beam-width's definition (src/serve/outputs.hpp), width {BEAM_WIDTH}, "
                     f"{BEAM_NEW_TOKENS} tokens after the prompt: score = sum of log softmax(logits)[token] over the "
                     "generated tokens (float64 log-softmax of the float32 logits); each step every beam extended by "
                     "every token, the best `width` kept (ties: better-ranked beam, then lower token id); no EOS, no "
                     "length penalty; logits recomputed from scratch over each beam's sequence (no KV cache); beams "
                     "best first; min_gap = the smallest score gap between the last kept and the first dropped "
                     "candidate over the steps",
        "heldout": {
            "file": "heldout.txt",
            "text": heldout,
            "ids": heldout_ids,
            "n_tokens": len(heldout_ids),
            "scoring": "ids = encode(text) with BOS; one window (n_tokens <= context 256); the logits at positions "
                       "0..n_tokens-2 predict ids[1..n_tokens-1]; nll_sum = sum of -log softmax(logits[p])[ids[p+1]] "
                       "(natural log, log-softmax in float64 of the float32 logits); mean_nll = nll_sum / "
                       "n_scored with n_scored = n_tokens - 1; perplexity = exp(mean_nll)",
        },
        "models": {},
    }
    floats = {}  # placeholder -> formatted list, to keep each logits row on one line
    for name, rel, fmt_name, model in models:
        m = {"checkpoint": rel, "format": fmt_name, "parameters": n_params(model),
             "family": "gpt2" if isinstance(model, GPT2) else "llama", "prompts": []}
        s, n, per = sequence_nll(model, heldout_ids)
        m["heldout"] = {"nll_sum": s, "n_scored": n, "mean_nll": s / n, "perplexity": math.exp(s / n),
                        "nll_per_target": f"@@{name}:nll@@"}
        floats[f"@@{name}:nll@@"] = "[" + ", ".join(f"{v:.9g}" for v in per) + "]"
        for prompt in PROMPTS:
            ids = tok.encode_reference(prompt, bos=True)
            cont, margins = greedy(model, ids, 64, ctx)
            full = ids + cont
            P = len(ids)
            positions = sorted(set([0, 1, P - 1, P - 1 + 20, P - 1 + 40]))
            with torch.no_grad():
                logits = model(torch.tensor([full[:positions[-1] + 1]]))[0]
            entry = {"text": prompt, "ids": ids, "greedy_ids": cont,
                     "greedy_text": prompt + tok.decode(cont, prev=ids[-1]), "min_top2_margin": min(margins),
                     "teacher_forced_ids": full[:positions[-1] + 1], "logits": {}}
            for p in positions:
                key = f"@@{name}:{prompt}:{p}@@"
                floats[key] = "[" + ", ".join(fmt_f32(v) for v in logits[p].tolist()) + "]"
                entry["logits"][str(p)] = key
            beams, gap = beam_search(model, ids, BEAM_WIDTH, BEAM_NEW_TOKENS, ctx)
            entry["beam_search"] = {"width": BEAM_WIDTH, "new_tokens": BEAM_NEW_TOKENS, "beams": beams, "min_gap": gap}
            m["prompts"].append(entry)
            log(f"{name}: {entry['greedy_text']!r} (min margin {min(margins):.3f})")
        log(f"{name}: heldout.txt {n} targets, mean NLL {s / n:.4f}, perplexity {math.exp(s / n):.3f}")
        ref["models"][name] = m
    text = json.dumps(ref, indent=1)
    # integer lists (token ids) on one line each
    text = re.sub(r"\[\n\s*(-?\d+(?:,\n\s*-?\d+)*)\n\s*\]",
                  lambda mt: "[" + ", ".join(re.findall(r"-?\d+", mt.group(1))) + "]", text)
    for key, val in floats.items():
        text = text.replace(json.dumps(key), val)
    with open(os.path.join(out, "reference.json"), "w") as f:
        f.write(text + "\n")
    log(f"wrote {os.path.join(out, 'reference.json')} ({len(text) / 1024:.0f} KiB); total {time.time() - T_START:.0f}s")


if __name__ == "__main__":
    main()
