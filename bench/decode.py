"""``python -m bench --decode``: greedy ``generate()`` through each compiler, tokens per second.

A Hugging Face ``LlamaForCausalLM`` (the zoo's decoder config: ``zoo_models._GQA``) and a
``GPT2LMHeadModel`` generate ``--tokens`` new tokens from the zoo's token ids, greedily,
with ``model.forward`` compiled by each peer: eager (nothing), Inductor
(``torch.compile(model.forward)``, default options) and opfuse
(``torch.compile(model.forward, backend="opfuse")``, default options). The first
``generate()`` of each compiles (its wall time is the ``first_s`` column); then the runs
are timed in interleaved rounds (``decode_s``: the median of the rounds). The tokens of
every compiler must equal eager's; ``compiles`` is how many graphs opfuse compiled.

Writes ``decode.json`` and ``decode.md`` to ``--out``.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from .output import cpu_name, write_table
from .zoo_models import _GQA, _seeded, _transformers

COMPILERS = ("eager", "inductor", "opfuse")
#: Positions the models take: the prompt (8) and up to 120 new tokens (the zoo's 64 is
#: its sequence, not a generation's).
POSITIONS = 128


def _models() -> dict[str, Callable[[], Any]]:
    def llama() -> Any:
        tf = _transformers()
        config = dict(_GQA, max_position_embeddings=POSITIONS)
        return _seeded(lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**config)))

    def gpt2() -> Any:
        tf = _transformers()
        cfg = tf.GPT2Config(vocab_size=_GQA["vocab_size"], n_embd=_GQA["hidden_size"],
                            n_layer=_GQA["num_hidden_layers"], n_head=_GQA["num_attention_heads"],
                            n_positions=POSITIONS)
        return _seeded(lambda: tf.GPT2LMHeadModel(cfg))

    return {"llama": llama, "gpt2": gpt2}


def _compiled(make: Callable[[], Any], compiler: str) -> Any:
    import torch

    model = make()
    if compiler == "inductor":
        model.forward = torch.compile(model.forward)
    elif compiler == "opfuse":
        import opfuse.torch

        opfuse.torch.register()
        model.forward = torch.compile(model.forward, backend="opfuse")
    return model


def run(tokens: int, rounds: int, out: Path) -> dict:
    import torch

    if tokens > POSITIONS - 8:
        raise SystemExit(f"bench --decode: at most {POSITIONS - 8} new tokens")
    import opfuse.api

    compiles = {"n": 0}
    real = opfuse.api.compile

    def counting(*args: Any, **kwargs: Any) -> Any:
        compiles["n"] += 1
        return real(*args, **kwargs)

    opfuse.api.compile = counting
    rows = []
    for name, make in _models().items():
        torch._dynamo.reset()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, _GQA["vocab_size"], (1, 8), generator=g)

        def gen(model: Any) -> Any:
            with torch.no_grad():
                return model.generate(ids, max_new_tokens=tokens, do_sample=False,
                                      min_new_tokens=tokens, pad_token_id=0)

        models, first, want = {}, {}, None
        for compiler in COMPILERS:
            before = compiles["n"]
            models[compiler] = _compiled(make, compiler)
            t0 = time.perf_counter()
            got = gen(models[compiler])
            first[compiler] = (time.perf_counter() - t0, compiles["n"] - before)
            want = got if want is None else want
            if not torch.equal(got, want):
                raise SystemExit(f"bench --decode: {compiler}'s tokens differ from eager's "
                                 f"on {name}")
        times: dict[str, list[float]] = {c: [] for c in COMPILERS}
        for _ in range(rounds):
            for compiler in COMPILERS:
                t0 = time.perf_counter()
                gen(models[compiler])
                times[compiler].append(time.perf_counter() - t0)
        for compiler in COMPILERS:
            decode = statistics.median(times[compiler])
            rows.append({"model": name, "compiler": compiler, "first_s": first[compiler][0],
                         "compiles": first[compiler][1], "decode_s": decode,
                         "tokens_per_s": tokens / decode,
                         "vs_eager": statistics.median(times["eager"]) / decode})
    opfuse.api.compile = real
    doc = {"tokens": tokens, "rounds": rounds, "rows": rows, "host": cpu_name(),
           "cpus": os.cpu_count(), "load": os.getloadavg(), "torch": torch.__version__}
    write_table(out, "decode", doc, _markdown(doc))
    print(_markdown(doc))
    return doc


def _markdown(doc: dict) -> str:
    lines = [f"greedy generate(), {doc['tokens']} new tokens, median of {doc['rounds']} "
             f"interleaved rounds after the first (compiling) one; {doc['cpus']} CPUs, load "
             f"{doc['load'][0]:.2f}; torch {doc['torch']}", "",
             "| model | compiler | first generate (s) | graphs opfuse compiled | tokens/s "
             "| vs eager |", "|---|---|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['model']} | {r['compiler']} | {r['first_s']:.2f} | {r['compiles']} "
                     f"| {r['tokens_per_s']:.1f} | {r['vs_eager']:.2f} |")
    return "\n".join(lines) + "\n"
