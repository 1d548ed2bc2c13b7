"""A Hugging Face Llama training iteration measured on a GPU, kernel by kernel: transformers' LlamaForCausalLM built
from a config (random weights, bf16, SDPA attention, tied nothing) trained eagerly with fused AdamW, the way a
Hugging Face Trainer or a plain PyTorch loop runs it. Run where a GPU is lent; writes one dated JSON file
(data/measured/gpu/<date>-<gpu>-llama-profile.json) that benchmarks/measure/breakdown_gpu.py reads.

    python benchmarks/measure/llama_profile_gpu.py --out data/measured/gpu/<date>-<gpu>-llama-profile.json

For each shape of SHAPES: the wall-clock and host-thread medians of 10 iterations after 3 warm-ups
(small_work_gpu._median_pass) and one profiled iteration's CUDA kernels by name with their launches and summed seconds
(unaligned_gemm_gpu._kernels).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import small_work_gpu as sw  # noqa: E402
import unaligned_gemm_gpu as ug  # noqa: E402

# (hidden, layers, heads, kv heads, ffn, vocabulary, micro-batch, sequence)
SHAPES = ((1024, 8, 16, 4, 4096, 32000, 8, 1024), (2048, 16, 32, 8, 8192, 32000, 4, 2048))
# ``--long``: four layers of Llama-2-7B's shape at 16,384 tokens, where attention is most of the layer
LONG = ((4096, 4, 32, 32, 11008, 32000, 1, 16384),)


def measure(torch, shape: tuple) -> dict:
    import transformers

    hidden, layers, heads, kv, ffn, vocab, batch, seq = shape
    config = transformers.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv, intermediate_size=ffn, vocab_size=vocab,
                                      max_position_embeddings=seq, tie_word_embeddings=False,
                                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step(model=model, opt=opt):
        model(input_ids=tokens, labels=tokens).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    wall, host = sw._median_pass(torch, step, 10, 3)
    out = {"hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv, "ffn": ffn, "vocab": vocab,
           "batch": batch, "seq": seq, "wall_s": wall, "host_s": host, "kernels": ug._kernels(torch, step)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--long", action="store_true", help="the LONG shapes instead of SHAPES")
    args = parser.parse_args(argv)
    import torch
    import transformers

    out = {"machine": sw.machine(torch) | {"transformers": transformers.__version__},
           "method": __doc__.split("\n\n", 2)[2].strip(), "rows": []}
    for shape in LONG if args.long else SHAPES:
        out["rows"].append(measure(torch, shape))
        torch.cuda.empty_cache()
        row = out["rows"][-1]
        print(f"{shape}: {row['wall_s'] * 1e3:.2f} ms wall, {row['host_s'] * 1e3:.2f} ms host", flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
