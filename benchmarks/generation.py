"""Decode throughput of the shared generation loop (``models/sampling.py::run_generation``).

For the toy backend (student and teacher presets) and tiny random Hugging Face checkpoints
(Qwen3 and Llama, built offline by ``build_tiny_hf_checkpoint``), greedy decoding of one
calculator prompt, three ways:

  kv        ``backend.generate``: prefill once, then one position per step against the KV
            cache, projecting only the last position (what rollouts use);
  recompute the same loop with a cache-free step that re-runs the whole sequence for every
            token (the reference the tests compare against);
  generate  ``transformers``' own ``model.generate(do_sample=False)`` on the same model
            (HF only).

With ``--smollm2`` (or ``--smollm2-dir DIR``) the real SmolLM2-135M-Instruct is measured too
(``kv`` vs ``generate``, batch 1; ``miniverl models fetch smollm2-135m-instruct`` first, or the
conversion is done here into DIR).

Every arm must produce the same ids (asserted). Each arm runs ``--reps`` times, interleaved,
after one warm-up; the table shows the median tokens/s and the ratio to ``generate``.

    PYTHONPATH=src python benchmarks/generation.py
    PYTHONPATH=src python benchmarks/generation.py --quick
    PYTHONPATH=src python benchmarks/generation.py --device cuda --hidden 256 --layers 4
    PYTHONPATH=src python benchmarks/generation.py --smollm2 --new-tokens 64 --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from miniverl.models.hf import HFBackend
from miniverl.models.sampling import recompute_step, run_generation
from miniverl.models.tiny_hf import build_tiny_hf_checkpoint
from miniverl.models.tokenizers import ToyTokenizer
from miniverl.models.toy import ToyBackend
from miniverl.models.toy_config import TOY_STUDENT, TOY_TEACHER

PROMPT = (
    "<|im_start|>system\nUse the calculator tool, then answer inside <final> and </final>."
    "<|im_end|>\n<|im_start|>user\nCompute 12 * (7 - 3) and report the value.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def timed(fn: Callable[[], list[int]]) -> tuple[float, list[int]]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    ids = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, ids


def measure(arms: dict[str, Callable[[], list[int]]], reps: int) -> dict[str, tuple[float, int]]:
    """Median seconds and token count per arm; every arm must return the same ids."""
    reference: list[int] | None = None
    for name, fn in arms.items():
        ids = fn()  # warm-up, and the ids every later run must reproduce
        if reference is None:
            reference = ids
        if ids != reference:
            raise AssertionError(f"arm {name!r} produced different ids:\n{ids}\nvs\n{reference}")
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(reps):
        for name, fn in arms.items():
            elapsed, ids = timed(fn)
            if ids != reference:
                raise AssertionError(f"arm {name!r} is not deterministic")
            seconds[name].append(elapsed)
    assert reference is not None
    return {name: (statistics.median(s), len(reference)) for name, s in seconds.items()}


def toy_rows(new_tokens: int, reps: int, device: str) -> list[tuple[str, str, float, int]]:
    tokenizer = ToyTokenizer()
    prompt = tokenizer.encode(PROMPT)
    rows = []
    for model_id, config in (("toy-student", TOY_STUDENT), ("toy-teacher", TOY_TEACHER)):
        backend = ToyBackend(config, tokenizer, model_id=model_id, device=device, seed=0)
        module = backend.module
        reference_step = recompute_step(lambda ids, m=module: m.project(m(ids)[0]))

        def kv(b: ToyBackend = backend) -> list[int]:
            return b.generate(prompt, max_new_tokens=new_tokens, temperature=0.0).token_ids

        def recompute(step=reference_step) -> list[int]:
            return run_generation(
                step,
                prompt,
                tokenizer=tokenizer,
                max_new_tokens=new_tokens,
                temperature=0.0,
                eos_token_id=tokenizer.eos_token_id,
                device=device,
            ).token_ids

        result = measure({"kv": kv, "recompute": recompute}, reps)
        params = backend.capabilities.num_parameters
        rows += [(f"toy {model_id} ({params / 1e3:.0f}k)", arm, *result[arm]) for arm in result]
    return rows


def hf_rows(
    workdir: Path, new_tokens: int, reps: int, device: str, hidden: int, layers: int
) -> list[tuple[str, str, float, int]]:
    rows = []
    for arch in ("qwen3", "llama"):
        path = build_tiny_hf_checkpoint(
            workdir / arch, arch=arch, hidden_size=hidden, num_layers=layers, seed=0
        )
        backend = HFBackend(path, device=device, precision="float32")
        tokenizer = backend.tokenizer
        prompt = tokenizer.encode(PROMPT)
        model = backend.model
        input_ids = torch.tensor([prompt], device=device)
        reference_step = recompute_step(lambda ids, m=model: m(input_ids=ids).logits)

        def kv(b: HFBackend = backend, p: list[int] = prompt) -> list[int]:
            return b.generate(p, max_new_tokens=new_tokens, temperature=0.0).token_ids

        def generate(m=model, x=input_ids, tok=tokenizer) -> list[int]:
            with torch.no_grad():
                out = m.generate(
                    input_ids=x,
                    attention_mask=torch.ones_like(x),
                    max_new_tokens=new_tokens,
                    do_sample=False,
                    eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id,
                )
            return out[0, x.shape[1] :].tolist()

        def recompute(step=reference_step, p: list[int] = prompt, tok=tokenizer) -> list[int]:
            return run_generation(
                step,
                p,
                tokenizer=tok,
                max_new_tokens=new_tokens,
                temperature=0.0,
                eos_token_id=tok.eos_token_id,
                device=device,
            ).token_ids

        result = measure({"kv": kv, "generate": generate, "recompute": recompute}, reps)
        params = backend.capabilities.num_parameters
        label = f"hf {arch} L{layers} H{hidden} ({params / 1e3:.0f}k)"
        rows += [(label, arm, *result[arm]) for arm in result]
        backend.release()
    return rows


def real_rows(
    directory: Path, new_tokens: int, reps: int, device: str
) -> list[tuple[str, str, float, int]]:
    """SmolLM2-135M-Instruct (float32): our KV-cached loop vs ``model.generate()``, batch 1.

    ``recompute`` is left out: re-running 135M parameters over the whole sequence per token
    measures nothing the tiny models do not already show.
    """
    from miniverl.models.acquire import fetch_model

    path = fetch_model("smollm2-135m-instruct", directory)
    backend = HFBackend(path, device=device, precision="float32")
    tokenizer = backend.tokenizer
    prompt = tokenizer.encode(PROMPT)
    model = backend.model
    input_ids = torch.tensor([prompt], device=device)

    def kv() -> list[int]:
        return backend.generate(prompt, max_new_tokens=new_tokens, temperature=0.0).token_ids

    def generate() -> list[int]:
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=new_tokens,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        return out[0, input_ids.shape[1] :].tolist()

    result = measure({"kv": kv, "generate": generate}, reps)
    params = backend.capabilities.num_parameters
    label = f"smollm2-135m-instruct ({params / 1e6:.1f}M)"
    backend.release()
    return [(label, arm, *result[arm]) for arm in result]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU")
    parser.add_argument("--hidden", type=int, default=64, help="tiny HF hidden size")
    parser.add_argument("--layers", type=int, default=2, help="tiny HF layers")
    parser.add_argument("--quick", action="store_true", help="32 tokens, 2 repetitions")
    parser.add_argument("--smollm2", action="store_true", help="also the real SmolLM2-135M")
    parser.add_argument(
        "--smollm2-dir",
        type=Path,
        default=Path("models/smollm2-135m-instruct"),
        help="converted SmolLM2 directory (fetched there if missing)",
    )
    parser.add_argument("--only-smollm2", action="store_true", help="skip toy and tiny HF rows")
    args = parser.parse_args(argv)
    if args.quick:
        args.new_tokens, args.reps = 32, 2
    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, device {args.device}, "
        f"threads {torch.get_num_threads()}, greedy, max {args.new_tokens} new tokens, "
        f"median of {args.reps}"
    )
    rows = []
    if not args.only_smollm2:
        rows += toy_rows(args.new_tokens, args.reps, args.device)
        with tempfile.TemporaryDirectory() as tmp:
            rows += hf_rows(
                Path(tmp), args.new_tokens, args.reps, args.device, args.hidden, args.layers
            )
    if args.smollm2 or args.only_smollm2:
        rows += real_rows(args.smollm2_dir, args.new_tokens, args.reps, args.device)

    generate_rate = {m: n / s for m, arm, s, n in rows if arm == "generate"}
    print(
        f"{'model':34} {'arm':10} {'tokens':>6} {'median s':>9} {'tokens/s':>9} {'vs generate':>11}"
    )
    for model, arm, seconds, tokens in rows:
        rate = tokens / seconds
        ratio = f"{rate / generate_rate[model]:.2f}x" if model in generate_rate else "-"
        print(f"{model:34} {arm:10} {tokens:6d} {seconds:9.4f} {rate:9.1f} {ratio:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
