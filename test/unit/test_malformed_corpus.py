"""Malformed input never crashes the tools (issue #10, item 6).

A seeded corpus of broken programs, mutated from the example graphs (G1-G8 at their small
size): truncations, flipped characters, wrong element types, shape mismatches, unknown
ops, huge dimensions, plus binary, NUL-filled and non-UTF-8 files. Every file goes through
``fuse-opt`` and ``fuse-run --repeat 0`` in a subprocess of its own, under a time limit,
and must end with exit 0, or exit 1 with a located ``file:line:col: error:`` message: never
a signal, a Python traceback or exit 2 (an internal error). The corpus is the same on every
run (seeded); the one test of the suite allowed to take up to two minutes on two cores.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opfuse.frontends.builder.graphs import graphs

SEED = 10
MUTANTS_PER_KIND = 3
#: Seconds one tool may take on one file (the slowest well-formed seed takes ~5 s).
TIME_LIMIT_S = 60
#: ``file:line:col: error:``, or ``name: error:`` where the input's own location is a name
#: (the builder writes ``loc("softmax.exp")``, with no file position to give).
LOCATED = re.compile(r"^(\S+:\d+:\d+|[\w.$-]+): error: ", re.M)

_TYPES = ("f16", "bf16", "i32", "i1", "f8E4M3FN", "complex<f32>", "index", "f64")
_OPS = ("linalg.bogus", "foo.bar", "scf.while", "tensor.generate", "arith.addf")
_DIMS = ("0", "1", "1099511627776", "99999999999999999999", "17179869184", "-1", "?")


def _truncate(rng: random.Random, text: str) -> str:
    return text[: rng.randrange(1, len(text))]


def _flip(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        chars[rng.randrange(len(chars))] = rng.choice("{}()<>[]%@:=,x0123456789 \n\"#^")
    return "".join(chars)


def _replace_one(rng: random.Random, text: str, pattern: str, choices) -> str:
    spots = [m for m in re.finditer(pattern, text)]
    if not spots:
        return text
    m = rng.choice(spots)
    return text[: m.start()] + rng.choice(choices) + text[m.end():]


def _wrong_type(rng, text):
    return _replace_one(rng, text, r"\bf32\b", _TYPES)


def _shape(rng, text):  # one dimension of one tensor type changes: operands disagree
    return _replace_one(rng, text, r"(?<=tensor<)\d+|(?<=x)\d+(?=x)", [str(rng.randint(1, 9))])


def _unknown_op(rng, text):
    return _replace_one(rng, text, r"\b(linalg|arith|math|tensor)\.[a-z_]+\b", _OPS)


def _huge_dim(rng, text):
    return _replace_one(rng, text, r"(?<=tensor<)\d+", _DIMS)


MUTATIONS = {"truncated": _truncate, "flipped": _flip, "wrong-type": _wrong_type,
             "shape-mismatch": _shape, "unknown-op": _unknown_op, "huge-dim": _huge_dim}


def corpus(folder: Path) -> list[Path]:
    """Write the corpus into ``folder``; returns the files."""
    rng = random.Random(SEED)
    seeds = {name: g.to_mlir() for name, g in graphs(small=True).items()}
    files = []
    for kind, mutate in MUTATIONS.items():
        for i in range(MUTANTS_PER_KIND):
            name = rng.choice(sorted(seeds))
            path = folder / f"{kind}-{i}-{name}.mlir"
            path.write_text(mutate(rng, seeds[name]))
            files.append(path)
    raw = {
        "binary": bytes(rng.randrange(256) for _ in range(512)),
        "nul": bytes(256),
        "latin1": seeds["g3_softmax"].replace("softmax", "softmax\xe9").encode("latin-1"),
        "empty": b"",
        "named-module": b'module @m attributes {foo.bar = 1 : i64} {\n'
                        + seeds["g8_x_minus_mean"].encode() + b"\n}\n",
    }
    for name, data in raw.items():
        path = folder / f"{name}.mlir"
        path.write_bytes(data)
        files.append(path)
    return files


def _tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _run(cmd: list[str]) -> tuple[list[str], int, str]:
    env = {**os.environ, "OPFUSE_DEBUG": ""}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                              timeout=TIME_LIMIT_S, env=env)
    except subprocess.TimeoutExpired:
        return cmd, -999, f"timed out after {TIME_LIMIT_S} s"
    return cmd, proc.returncode, proc.stderr


def _problem(rc: int, err: str) -> str | None:
    if rc == -999:
        return err
    if rc < 0:
        return f"killed by signal {-rc}"
    if "Traceback" in err:
        return "a Python traceback"
    if rc == 1 and not LOCATED.search(err):
        return "exit 1 without a located file:line:col: error: message"
    if rc not in (0, 1):
        return f"exit {rc}"
    return None


def test_malformed_inputs_never_crash_the_tools(tmp_path):
    files = corpus(tmp_path)
    cmds = []
    for f in files:
        cmds.append([_tool("fuse-opt"), str(f)])
        cmds.append([_tool("fuse-run"), str(f), "--repeat", "0"])
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(_run, cmds))
    bad = []
    codes = {0: 0, 1: 0}
    for cmd, rc, err in results:
        codes[rc] = codes.get(rc, 0) + 1
        why = _problem(rc, err)
        if why:
            tail = "\n    ".join(err.strip().splitlines()[-6:])
            bad.append(f"{Path(cmd[0]).name} {Path(cmd[1]).name}: {why}\n    {tail}")
    assert not bad, f"{len(bad)} of {len(results)} runs failed:\n" + "\n".join(bad)
    # the corpus exercises both outcomes: refusals, and mutants that are still valid
    assert codes[1] > len(results) // 2 and codes[0] > 0, codes


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_each_mutation_changes_its_seed(kind):
    rng = random.Random(SEED)
    seed = graphs(small=True)["g3_softmax"].to_mlir()
    assert any(MUTATIONS[kind](rng, seed) != seed for _ in range(5))
