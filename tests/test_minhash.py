"""One-permutation MinHash (data/minhash.py): the estimate against the exact Jaccard, LSH parameters
as datasketch chooses them, and the near-duplicate rules built on them."""

from __future__ import annotations

import random

import numpy as np

from recipetune.data.minhash import EMPTY, BucketIndex, lsh_params, near_duplicates, normalize, signatures, similarity


def shingles(text: str, k: int = 5) -> set[str]:
    t = normalize(text)
    return {t[i : i + k] for i in range(len(t) - k + 1)} if len(t) >= k else {t}


def test_the_estimate_is_unbiased_within_its_sampling_error():
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 8))) for _ in range(500)]
    pairs = []
    for _ in range(300):
        a = [rng.choice(words) for _ in range(rng.randint(5, 40))]
        b = [w if rng.random() < rng.random() else rng.choice(words) for w in a]
        pairs.append((" ".join(a), " ".join(b)))
    est = similarity(signatures([a for a, _ in pairs], 128), signatures([b for _, b in pairs], 128))
    exact = np.array([len(shingles(a) & shingles(b)) / len(shingles(a) | shingles(b)) for a, b in pairs])
    assert abs(np.mean(est - exact)) < 0.01  # unbiased
    assert np.sqrt(np.mean((est - exact) ** 2)) < 2 * np.sqrt(np.mean(exact * (1 - exact) / 128)) + 0.01


def test_signatures_ignore_case_and_spacing_and_batching():
    one = signatures(["Return  the VALUE\n of x"], 64)
    many = signatures(["other text entirely", "return the value of x", ""], 64)
    assert (one[0] == many[1]).all()
    assert (many[2] == EMPTY).all() and similarity(many[2], many[2]) == 0.0  # empty matches nothing
    short = signatures(["ab", "ab", "abc"], 64)  # under k characters: one shingle, the whole text
    assert similarity(short[0], short[1]) == 1.0 and similarity(short[0], short[2]) < 0.2


def test_lsh_parameters_are_datasketchs_optimum():
    assert lsh_params(0.8, 64) == (5, 11) and lsh_params(0.9, 64) == (3, 21) and lsh_params(0.5, 64) == (14, 4)


def test_near_duplicates_keep_the_first_and_verify_the_estimate():
    base = "Return the number of bytes written to the underlying stream, counting the headers too"
    texts = [base, base.replace("bytes", "byte"), "Something else: open a socket and listen on a port",
             base.upper(), "Return the number of lines read from the stream"]
    match = near_duplicates(signatures(texts, 64), 0.8)
    assert match.tolist() == [-1, 0, -1, 0, -1]
    index = BucketIndex(signatures(texts[:1], 64), 0.8)
    assert index.query(signatures(texts, 64)).tolist() == [0, 0, -1, 0, -1]
