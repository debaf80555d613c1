"""A small Llama-class model with a real tokenizer, for the SGLang start on the device machine.

    python3 tests/device/gpu_model.py files --out DIR            # here: config and tokenizer
    python3 tests/device/gpu_model.py train --model DIR --seconds S  # there: the weights, on the GPU

``files`` writes ``config.json``, ``generation_config.json``, a byte-level BPE ``tokenizer.json``
trained with the ``tokenizers`` library, and ``tokenizer_config.json`` with a chat template:
what ``sglang.launch_server --model-path DIR`` and its benchmark read, without the weights.
``train`` trains the weights for S seconds on the GPU (bf16, AdamW) and writes
``model.safetensors`` beside them, then prints one ``TRAIN_JSON {...}`` line (steps, tokens,
loss at the start and the end, seconds).

Both train on text the machine running them holds (``corpus``): the help topics of its Python
(``pydoc_data.topics``) and the descriptions of its installed Python packages (the
``METADATA`` of every distribution its Python sees), each made a chat turn (``<|user|>`` a
title, ``<|assistant|>`` the text, ``<|end|>``), so that the model learns the template the
generation check's chat completion is asked through and answers with prose, not a repeated
token. The tokenizer is trained here and the weights there, on the same kinds of text.
"""

from __future__ import annotations

import argparse
import email.parser
import importlib.metadata
import json
import random
import sys
import time
from pathlib import Path

USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL = ["<|endoftext|>", USER, ASSISTANT, END]
VOCAB = 8192
CONTEXT = 2048
#: A Llama of about 30 M parameters: trains to fluent recitation in a minute on an H100.
SHAPE = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
         "num_attention_heads": 8, "num_key_value_heads": 4}
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n"
                 "{{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
#: A package description shorter than this says nothing worth learning.
MIN_CHARS = 200


def turn(title: str, text: str) -> str:
    """One training document: a chat turn in the template's own words."""
    return f"{USER}\n{title}\n{ASSISTANT}\n{text.strip()}{END}"


def corpus() -> list[str]:
    """The documents: this Python's help topics and its packages' descriptions, as turns."""
    docs = []
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a Python built without its docs
        topics = {}
    for name, text in sorted(topics.items()):
        docs.append(turn(f"Explain {name} in Python.", text))
    seen = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name") or ""
        if not name or name.lower() in seen:
            continue
        seen.add(name.lower())
        raw = dist.read_text("METADATA") or ""
        body = email.parser.Parser().parsestr(raw).get_payload() or ""
        summary = dist.metadata.get("Summary") or ""
        text = (summary + "\n\n" + body).strip() if isinstance(body, str) else summary
        if len(text) >= MIN_CHARS:
            docs.append(turn(f"What is {name}?", text[:200_000]))
    return docs


def train_tokenizer(docs: list[str], out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(docs, trainer)
    tokenizer.save(str(out / "tokenizer.json"))


def write_files(out: Path) -> dict:
    """Config, generation config, tokenizer and its config in OUT; what was written."""
    out.mkdir(parents=True, exist_ok=True)
    docs = corpus()
    train_tokenizer(docs, out)
    from tokenizers import Tokenizer

    ids = {token: Tokenizer.from_file(str(out / "tokenizer.json")).token_to_id(token)
           for token in SPECIAL}
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPE,
        "vocab_size": VOCAB, "max_position_embeddings": CONTEXT, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids[END],
        "pad_token_id": ids["<|endoftext|>"], "torch_dtype": "bfloat16",
        "attention_bias": False, "mlp_bias": False, "head_dim": 64,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
         "pad_token_id": config["pad_token_id"]}, indent=1) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
        "eos_token": END, "pad_token": "<|endoftext|>", "unk_token": None,
        "model_max_length": CONTEXT, "chat_template": CHAT_TEMPLATE,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
    }, indent=1) + "\n")
    return {"documents": len(docs), "characters": sum(map(len, docs)), "vocab": VOCAB,
            "special_ids": ids}


def token_stream(model: Path, docs: list[str]):
    """All documents' token ids in one shuffled stream (a torch tensor)."""
    import torch
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    random.Random(0).shuffle(docs)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(docs):
        ids.extend(encoding.ids)
    return torch.tensor(ids, dtype=torch.long)


def train(model: Path, seconds: float, batch: int, seq: int, device: str) -> dict:
    """Train the weights for SECONDS and save them (bf16 safetensors) in MODEL."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    began = time.monotonic()
    torch.manual_seed(0)
    stream = token_stream(model, corpus())
    config = LlamaConfig.from_pretrained(str(model))
    net = LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)
    optimiser = torch.optim.AdamW(net.parameters(), lr=2e-3, betas=(0.9, 0.95),
                                  weight_decay=0.1, fused=device == "cuda")
    data = stream.to(device)
    starts = len(data) - seq - 1
    losses, steps, tokens = [], 0, 0
    prepared = time.monotonic()
    warmup = 50
    while time.monotonic() - prepared < seconds:
        offsets = torch.randint(0, starts, (batch,), device=device)
        index = offsets[:, None] + torch.arange(seq + 1, device=device)[None, :]
        window = data[index]
        lr = 2e-3 * min(1.0, (steps + 1) / warmup)
        for group in optimiser.param_groups:
            group["lr"] = lr
        loss = net(input_ids=window[:, :-1], labels=window[:, 1:].contiguous(),
                   use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
        steps += 1
        tokens += batch * seq
        if steps == 1 or steps % 50 == 0:
            losses.append((steps, round(float(loss), 4)))
    losses.append((steps, round(float(loss), 4)))
    trained = time.monotonic()
    net.save_pretrained(str(model), safe_serialization=True)
    return {"steps": steps, "tokens": tokens, "stream_tokens": int(len(stream)),
            "first_loss": losses[0][1], "last_loss": losses[-1][1], "losses": losses[-8:],
            "prepare_s": round(prepared - began, 1), "train_s": round(trained - prepared, 1),
            "save_s": round(time.monotonic() - trained, 1),
            "parameters": sum(p.numel() for p in net.parameters())}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    files = commands.add_parser("files")
    files.add_argument("--out", type=Path, required=True)
    fit = commands.add_parser("train")
    fit.add_argument("--model", type=Path, required=True)
    fit.add_argument("--seconds", type=float, default=90)
    fit.add_argument("--batch", type=int, default=64)
    fit.add_argument("--seq", type=int, default=512)
    fit.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if args.command == "files":
        result = write_files(args.out)
    else:
        result = train(args.model, args.seconds, args.batch, args.seq, args.device)
    print(("FILES_JSON " if args.command == "files" else "TRAIN_JSON ") + json.dumps(result),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
