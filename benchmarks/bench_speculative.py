"""Speculative decoding: tokens per target pass and tokens/s, speculative against not, at batch 1 and 8, one thread.

Model: a random-init ``transformers`` Llama (``--size small``: hidden 256, 4 layers, vocab 2048; ``tiny``: the
test config, hidden 32, 2 layers, vocab 100; ``pyrt/testing/archs.py``), exported once with
``decoder_to_pte(builder="portable", max_batch_size=8)`` (its default token budget: 144 per step here). Per
sample and side, one ``pyrt.generate`` call over B prompts (greedy, ``--new-tokens`` each, EOS ignored), sides
interleaved; medians over ``--samples``. tokens/s = B * new / the call's wall time (prefill included, the same
on both sides); tokens per pass = new tokens / the target's forward calls that gave them (the prefill's
included).
Every speculative side must give the plain side's tokens exactly.

* (a) the target as its own draft (the same file loaded twice): every guess is right, the machinery's
  upper bound (goal: at least 0.9 (k + 1) tokens per pass);
* (b) ``draft="ngram"`` on an input-grounded workload: each prompt is the target's own greedy continuation
  of a random prompt pasted before that prompt; beside it, an offline replay of the same prompt lookup over
  the same output (each pass: the guesses the lookup makes from the tokens so far, kept while they equal
  the output; goal: tokens per pass within 10% of it: no pass wasted);
* (c) a small draft file: the target's first layer (embeddings, that layer, final norm and head: the same
  vocabulary) trained for ``--distill-steps`` steps to predict the target's greedy tokens on its own
  continuations of other random prompts (random weights have nothing a smaller model agrees on untrained);
  its agreement with the target on the benchmark's continuations is printed.

Goals (issue #36), on this CPU at batch 1: wall-clock at least 1.3x non-speculative whenever tokens per pass
is at least 2. The GPU part (the target's weights streamed from pinned host memory: speculative / plain
tokens/s at least 0.8 x tokens per pass) needs a GPU.

    python benchmarks/bench_speculative.py [--size small|tiny] [--k 4] [--samples 3] [--no-write]

``--tree`` (issue #44): tree speculation against a chain at the same draft. The target (Llama ``--size``) and two
drafts made by perturbing its weight matrices (each plus ``scale`` times its own spread of Gaussian noise) so
that they agree with it on about 74% and 54% of its greedy tokens (measured and printed), as pyrt's slot module
that verifies trees run eagerly as the engine's program (``tests/fixtures/eager_slots.py``: the module
``decoder_to_pte(max_batch_size=...)`` exports; the engine, row allocation, tree growth and verification are
pyrt's own). Each prompt alone (batch 1, the single user of a weight-streamed model), greedy; the tokens are
checked equal to transformers' greedy. Per configuration (a chain of k = 4; trees of 8, 16, 32, 64 grown best
first): tokens per target pass, draft passes per target pass, and tokens/s of a model where a target pass costs
``--pass-cost-s`` (the weight transfer of a streamed model) and a draft pass ``--draft-cost-s`` (a resident
draft): tokens / (target passes x pass cost + draft passes x draft cost). ``--int4``: the target's own INT4 copy
(``decoder_to_pte(quantize="int4")``, portable kernels, SubSpec's idea) as a third draft. Goals: a tree of 32
gives at least 1.4x the chain's tokens per pass with the ~54% draft, 1.2x with the ~74% one, and 1.2x its
modelled tokens/s.

    python benchmarks/bench_speculative.py --tree [--int4] [--size small] [--new-tokens 48] [--prompts 8] [--no-write]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from _common import command_line, machine, markdown_table, write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SLOTS, PROMPT_LEN, DISTILL_PROMPTS = 8, 16, 1024


def models(size: str) -> tuple[Any, Any]:
    """(target, its first layer alone with the target's weights): Llama of ``size``."""
    from pyrt.testing import archs

    variant, layers = ("llm_small", 4) if size == "small" else ("llm", 2)
    target = archs.causal_lm("llama", variant=variant, layers=layers)
    draft = archs.causal_lm("llama", variant=variant, layers=1)
    missing, _ = draft.load_state_dict(target.state_dict(), strict=False)
    assert not missing, missing
    return target, draft


def continuations(model: Any, prompts: list[list[int]], new: int) -> list[list[int]]:
    """``model``'s greedy tokens after each prompt (transformers, batched: equal-length prompts)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor(prompts), max_new_tokens=new, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return [row[len(prompts[0]):].tolist() for row in out]


def distill(target: Any, draft: Any, steps: int, new: int, vocab: int) -> Any:
    """Train ``draft`` to give ``target``'s greedy next token on ``target``'s continuations of
    :data:`DISTILL_PROMPTS` random prompts (seeds apart from the benchmark's prompts)."""
    import numpy as np
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(1000)
    seqs = torch.cat([torch.tensor([p + c for p, c in zip(batch, continuations(target, batch, new), strict=True)])
                      for batch in ([rng.integers(3, vocab, PROMPT_LEN).tolist() for _ in range(64)]
                                    for _ in range(DISTILL_PROMPTS // 64))])
    with torch.no_grad():
        labels = torch.cat([target(seqs[i:i + 64]).logits.argmax(-1) for i in range(0, len(seqs), 64)])
    draft.train()
    opt = torch.optim.Adam(draft.parameters(), lr=1e-3)
    for _ in range(steps):
        pick = torch.randint(0, len(seqs), (32,))
        logits = draft(seqs[pick]).logits[:, PROMPT_LEN - 1:].reshape(-1, vocab)
        loss = torch.nn.functional.cross_entropy(logits, labels[pick][:, PROMPT_LEN - 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return draft.eval()


def agreement(target: Any, draft: Any, prompts: list[list[int]], outs: list[list[int]]) -> float:
    """The share of the target's greedy tokens (after ``prompts``) that ``draft``'s argmax gives too."""
    import torch

    seqs = torch.tensor([p + o for p, o in zip(prompts, outs, strict=True)])
    with torch.no_grad():
        mine = draft(seqs).logits.argmax(-1)[:, PROMPT_LEN - 1:-1]
    return float((mine == seqs[:, PROMPT_LEN:]).float().mean())


def replay(prompt: list[int], tokens: list[int], k: int) -> float:
    """Tokens per pass that prompt lookup gives offline over ``tokens`` (the prefill's pass included): each pass
    the guesses it makes from the tokens so far (filled to the room with the last token, as the engine fills
    them), kept while they equal ``tokens``."""
    from pyrt.llm.drafting import fill
    from pyrt.llm.guesses import Proposal
    from pyrt.llm.ngram import lookup

    done, passes = 1, 1
    while done < len(tokens):
        room = min(k, len(tokens) - done - 1)  # as the scheduler caps it by max_new_tokens
        found = lookup(prompt + tokens[:done], room) if room else ()
        guess = fill(Proposal(found) if found else None, tokens[done - 1], room, 1).tokens if room else ()
        kept = next((i for i, g in enumerate(guess) if g != tokens[done + i]), len(guess))
        done, passes = done + kept + 1, passes + 1
    return len(tokens) / passes


def side(prog: Any, prompts: list[list[int]], new: int, draft: Any, k: int) -> Any:
    import pyrt

    def run() -> dict[str, Any]:
        t0 = time.perf_counter()
        out = pyrt.generate(prog, prompts, max_new_tokens=new, eos_ids=[], draft=draft, draft_tokens=k)
        wall = time.perf_counter() - t0
        return {"tps": len(prompts) * new / wall, "tokens": [r.tokens for r in out],
                "passes": sum(r.passes for r in out), "drafted": sum(r.drafted for r in out),
                "accepted": sum(r.accepted for r in out)}

    return run


def measure(sides: dict[str, Any], samples: int) -> dict[str, dict[str, Any]]:
    for run in sides.values():
        run()  # warm up
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for _ in range(samples):
        for name, run in sides.items():
            got[name].append(run())
    return {name: {**runs[0], "tps": statistics.median(r["tps"] for r in runs)} for name, runs in got.items()}


def rows_for(batch: int, plain: dict[str, Any], spec: dict[str, Any], what: str, new: int,
             replayed: float | None) -> list[str]:
    assert spec["tokens"] == plain["tokens"], f"{what}: speculative tokens differ from plain greedy"
    per_pass = batch * new / spec["passes"]
    acceptance = spec["accepted"] / spec["drafted"] if spec["drafted"] else 0.0
    return [what, str(batch), f"{acceptance:.2f}", f"{per_pass:.2f}", "" if replayed is None else f"{replayed:.2f}",
            f"{plain['tps']:.0f}", f"{spec['tps']:.0f}", f"{spec['tps'] / plain['tps']:.2f}x"]


def run(args: argparse.Namespace, directory: Path) -> tuple[list[list[str]], float]:
    import numpy as np

    import pyrt
    from pyrt.export import decoder_to_pte

    target, draft_model = models(args.size)
    vocab = target.config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, vocab, PROMPT_LEN).tolist() for _ in range(SLOTS)]
    outs = continuations(target, prompts, args.new_tokens)
    grounded = [o + p for p, o in zip(prompts, outs, strict=True)]
    draft_model = distill(target, draft_model, args.distill_steps, args.new_tokens, vocab)
    agreed = agreement(target, draft_model, prompts, outs)
    paths = {}
    for name, model in (("target", target), ("draft", draft_model)):
        paths[name] = directory / f"{name}.pte"
        decoder_to_pte(model, paths[name], max_seq_len=PROMPT_LEN + 2 * args.new_tokens, builder="portable",
                       max_batch_size=SLOTS, progress=False)
    prog, itself, small = (pyrt.Program(paths[n]) for n in ("target", "target", "draft"))
    table, k = [], args.k
    for batch in args.batches:
        random, echo = prompts[:batch], grounded[:batch]
        got = measure({"plain": side(prog, random, args.new_tokens, None, k),
                       "itself": side(prog, random, args.new_tokens, itself, k),
                       "small": side(prog, random, args.new_tokens, small, k),
                       "plain echo": side(prog, echo, args.new_tokens, None, k),
                       "ngram": side(prog, echo, args.new_tokens, "ngram", k)}, args.samples)
        replayed = sum(len(t) for t in got["plain echo"]["tokens"]) / sum(
            len(t) / replay(p, t, k) for p, t in zip(echo, got["plain echo"]["tokens"], strict=True))
        table.append(rows_for(batch, got["plain"], got["itself"], "(a) target as its own draft", args.new_tokens,
                              None))
        table.append(rows_for(batch, got["plain echo"], got["ngram"], "(b) ngram, input-grounded", args.new_tokens,
                              replayed))
        table.append(rows_for(batch, got["plain"], got["small"], "(c) 1-layer draft", args.new_tokens, None))
    return table, agreed


TREE_SIZES = (8, 16, 32, 64)
SCALES = (0.045, 0.09)  # perturbations of the target's matrices: about 74% and 54% greedy agreement (small)


class Counting:
    """A draft Program's runs counted (``calls``), as a target of its own for ``draft=`` (its own drafter each time)."""

    def __init__(self, program: Any) -> None:
        from pyrt.llm.program import engine_convention

        self.program, self.source, self.calls = program, str(program.source), list[int]()
        self.conv = engine_convention(program, "forward")

    def run(self, *inputs: Any, method: str = "forward") -> Any:
        self.calls.append(len(inputs[0]))
        return self.program.run(*inputs, method=method)

    def fresh(self) -> Any:
        import types

        self.calls = []
        return types.SimpleNamespace(program=self, conv=self.conv, source=self.source)


def int4_draft(target: Any, context: int, directory: Path) -> Counting:
    """The target's own INT4 copy (``decoder_to_pte(quantize="int4")``, portable, 2 slots) as a draft file."""
    import pyrt
    from pyrt.export import decoder_to_pte

    path = directory / "int4.pte"
    decoder_to_pte(target, path, max_seq_len=context, builder="portable", max_batch_size=2, max_tokens_per_step=64,
                   quantize="int4", progress=False)
    return Counting(pyrt.Program(path))


def tree_run(args: argparse.Namespace, directory: Path) -> tuple[list[list[str]], list[float]]:
    """Rows of the tree table (see the module docstring) and each draft's measured agreement."""
    import numpy as np

    from pyrt.llm import Engine, SamplingParams
    from pyrt.testing import archs
    from tests.fixtures import eager_slots as E

    variant, layers = ("llm_small", 4) if args.size == "small" else ("llm", 2)
    target = archs.causal_lm("llama", variant=variant, layers=layers)
    vocab = target.config.vocab_size
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, vocab, PROMPT_LEN).tolist() for _ in range(args.prompts)]
    wanted = continuations(target, prompts, args.new_tokens)
    greedy = SamplingParams(max_new_tokens=args.new_tokens, eos_ids=())
    context = PROMPT_LEN + args.new_tokens + max(TREE_SIZES) + 1
    table, agreed = [], []
    drafts: list[tuple[str, Any]] = []
    for scale in SCALES:
        draft = E.perturbed(target, scale)
        agreed.append(agreement(target, draft, prompts, wanted))
        drafts.append((f"{agreed[-1]:.0%}", draft))
    if args.int4:
        drafts.append(("INT4 copy", int4_draft(target, context, directory)))
    for label, draft in drafts:
        chain_rate = chain_tps = 0.0
        for k, tree in ((args.k, False), *((n, True) for n in TREE_SIZES)):
            llm, program = E.loop(target, slots=1, tokens_per_step=k + 1, max_seq_len=context)
            if isinstance(draft, Counting):
                drafter, draft_program = draft.fresh(), draft
            else:
                drafter, draft_program = E.loop(draft, slots=1, tokens_per_step=64, max_seq_len=context, tree=False,
                                                name="draft")
            engine = Engine(llm, draft=drafter, draft_tokens=k, draft_tree=tree)
            tokens = passes = 0
            for prompt, want in zip(prompts, wanted, strict=True):
                stream = engine.submit(prompt, greedy)
                stream.wait()
                result = stream.result
                what = f"tree {k}" if tree else f"chain k={k}"
                assert result is not None and result.tokens == want, f"draft {label}, {what}: not greedy's"
                tokens, passes = tokens + len(result.tokens), passes + result.passes
            steps, draft_calls = engine.stats()["steps"], len(draft_program.calls)
            per_pass = tokens / passes
            tps = tokens / (steps * args.pass_cost_s + draft_calls * args.draft_cost_s)
            if not tree:
                chain_rate, chain_tps = per_pass, tps
            if not tree and isinstance(draft, Counting):
                label = f"INT4 copy ({engine.stats()['acceptance_rate']:.0%} of chain guesses)"
            table.append([label, f"tree {k}" if tree else f"chain k={k}", f"{per_pass:.2f}",
                          f"{per_pass / chain_rate:.2f}x", f"{engine.stats()['accepted_depth']:.2f}",
                          f"{draft_calls / steps:.1f}", f"{tps:.2f}", f"{tps / chain_tps:.2f}x"])
            engine.close()
    return table, agreed


def tree_main(args: argparse.Namespace) -> None:
    import torch
    import transformers

    torch.set_num_threads(1)
    args.new_tokens = args.new_tokens or 48
    with tempfile.TemporaryDirectory() as tmp:
        table, _ = tree_run(args, Path(tmp))
    head = ["draft agreement", "guesses", "tokens/pass", "vs chain", "accepted depth", "draft passes/pass",
            "modelled tok/s", "vs chain"]
    text = (f"`{command_line()}` ({machine()}; torch {torch.__version__}, transformers {transformers.__version__}; "
            f"threads 1)\n\nLlama {args.size} config target; drafts: the target with its matrices perturbed "
            f"(scales {', '.join(map(str, SCALES))}; agreement: the share of the target's greedy tokens the draft's "
            f"argmax gives); {args.prompts} random {PROMPT_LEN}-token prompts, each alone (batch 1), "
            f"{args.new_tokens} new tokens greedy, equal to transformers' greedy on every row; pyrt's slot module that "
            f"verifies trees run eagerly as the engine's program. Modelled tok/s: a target pass costs "
            f"{args.pass_cost_s} s (a streamed weight pass), a draft pass {args.draft_cost_s} s (resident):\n\n"
            + markdown_table(head, table))
    print(text)
    if not args.no_write:
        write_results(f"bench_speculative_tree_{args.size}{'_int4' if args.int4 else ''}", "Tree speculation", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="store_true", help="tree speculation against a chain (issue #44)")
    parser.add_argument("--prompts", type=int, default=8, help="--tree: prompts, each alone (default 8)")
    parser.add_argument("--int4", action="store_true", help="--tree: the target's INT4 copy as a draft too")
    parser.add_argument("--pass-cost-s", type=float, default=0.25, help="--tree: a target pass's modelled cost")
    parser.add_argument("--draft-cost-s", type=float, default=0.005, help="--tree: a draft pass's modelled cost")
    parser.add_argument("--size", choices=["small", "tiny"], default="small")
    parser.add_argument("--k", type=int, default=4, help="draft_tokens (default 4)")
    parser.add_argument("--new-tokens", type=int, help="default 64 (small), 24 (tiny: 64 positions)")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[1, 8])
    parser.add_argument("--distill-steps", type=int, default=100)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.tree:
        tree_main(args)
        return
    args.new_tokens = args.new_tokens or (64 if args.size == "small" else 24)
    import torch
    import transformers

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        table, agreed = run(args, Path(tmp))
    head = ["workload", "B", "acceptance", "tokens/pass", "replay tokens/pass", "plain tok/s", "speculative tok/s",
            "speculative / plain"]
    text = (f"`{command_line()}` ({machine()}; torch {torch.__version__}, transformers {transformers.__version__}; "
            f"threads 1)\n\nLlama {args.size} config, {PROMPT_LEN}-token random prompts (input-grounded: the "
            f"target's {args.new_tokens}-token greedy continuation pasted before them), {args.new_tokens} new tokens "
            f"greedy, k = {args.k}, portable kernels; tokens equal plain greedy on every row; the 1-layer draft "
            f"agrees with the target on {agreed:.0%} of its greedy tokens; median of {args.samples} samples:\n\n"
            + markdown_table(head, table))
    print(text)
    if not args.no_write:
        write_results(f"bench_speculative_{args.size}", "Speculative decoding", text)


if __name__ == "__main__":
    main()
